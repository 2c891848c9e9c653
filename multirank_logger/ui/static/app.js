/* multirank-logger ui: the runs, a run (findings, band charts, rank x step heatmaps, logs), compare.
 * Draws what the server sends (per-bucket summaries, one byte per heatmap cell), never rows.
 * In a self-contained report (window.MRL_STATIC) the same code reads the embedded answers. */
"use strict";
(function () {
  const STATIC = window.MRL_STATIC || null;
  const POLL_MS = 2000;
  const REDRAW_SHARE = 20;
  const MAX_FLAGGED = 8;  // departing ranks whose lines a chart draws (ui/views.py's MAX_FLAGGED)
  const MAX_LEGEND = 32;
  const main = document.getElementById("main");
  const liveNote = document.getElementById("live");
  const LINE_COLOURS = ["#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#2ca02c"];
  const LEVELS = { DEBUG: 10, INFO: 20, WARNING: 30, ERROR: 40, CRITICAL: 50 };

  async function api(path) {
    if (STATIC) {
      if (path in STATIC.answers) return STATIC.answers[path];
      throw new Error("This file holds no " + path + ": open the run with `multirank-logger ui`.");
    }
    let r;
    try { r = await fetch("/api/" + path, { cache: "no-store" }); }
    catch (e) { throw new Error("The server does not answer: is `multirank-logger ui` still running?"); }
    let body = null;
    try { body = await r.json(); } catch (e) { /* not JSON: said below */ }
    if (!r.ok || body === null) throw new Error((body && body.error) || "The server answered " + r.status + ".");
    return body;
  }

  function el(tag, attrs, ...kids) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else if (v !== null && v !== undefined) node.setAttribute(k, v);
    }
    for (const kid of kids.flat()) if (kid !== null && kid !== undefined) node.append(kid.nodeType ? kid : String(kid));
    return node;
  }
  const num = (v) => (v === null || v === undefined ? "-" : Math.abs(v) >= 1e4 || (Math.abs(v) < 1e-3 && v !== 0) ? v.toExponential(3) : +v.toPrecision(4));
  const dur = (s) => (s === null || s === undefined ? "-" : s < 120 ? s.toFixed(1) + " s" : s < 7200 ? (s / 60).toFixed(1) + " min" : (s / 3600).toFixed(1) + " h");
  const when = (t) => (t ? new Date(t * 1000).toLocaleString() : "-");
  const runHref = (id) => (STATIC ? "#" : "/run/" + id);
  function fail(where, err) { where.replaceChildren(el("p", { class: "error" }, err.message || String(err))); }
  function setLive(text) { liveNote.textContent = text; }

  // -- the runs ---------------------------------------------------------------------------
  async function runsPage() {
    const table = el("table", { id: "runs" });
    const compare = el("form", { id: "compare", action: "/compare" });
    main.replaceChildren(el("h1", {}, "Runs"), table, el("h2", {}, "Compare two runs"), compare);
    let first = true, shown = "";
    async function refresh() {
      let runs;
      // only a store that holds one run when the page opens goes straight to it; a run that
      // appears later is listed (the page never navigates away under its reader)
      const opening = first;
      first = false;
      try { runs = await api("runs"); } catch (e) { shown = ""; fail(table, e); return; }
      if (opening && runs.length === 1) { location.replace(runHref(runs[0].id)); return; }
      const token = JSON.stringify(runs);
      if (token === shown) return;
      shown = token;
      table.replaceChildren(
        el("tr", {}, ...["id", "run", "status", "ranks", "nodes", "duration", "last step", "transport", "started"].map((h) => el("th", {}, h))),
        ...runs.map((r) => el("tr", { "data-run": r.id },
          el("td", {}, r.id), el("td", {}, el("a", { href: runHref(r.id) }, r.run)), el("td", { class: "st-" + r.status }, r.status),
          el("td", {}, r.ranks), el("td", {}, r.nodes ?? "-"), el("td", {}, dur(r.duration_s)), el("td", {}, r.last_step ?? "-"),
          el("td", {}, r.transport ?? "-"), el("td", {}, when(r.started)))));
      const pick = (name) => el("select", { name }, ...runs.map((r) => el("option", { value: r.id }, r.id + ": " + r.run)));
      if (runs.length > 1 && !compare.childElementCount) compare.replaceChildren(pick("a"), pick("b"), el("button", { type: "submit" }, "Compare"));
    }
    await refresh();
    if (!STATIC) setInterval(refresh, POLL_MS);
  }

  // -- a run ------------------------------------------------------------------------------
  async function runPage(id) {
    const head = el("section", { id: "head" }), found = el("section", { id: "findings" }, el("h2", {}, "Findings"), el("p", { class: "muted" }, "computing…"));
    const charts = el("section", { id: "charts" }), logs = el("section", { id: "logs" });
    main.replaceChildren(head, found, charts, logs);
    let run;
    for (;;) {  // a store being created, or a run not there yet: say so, and look again
      try { run = await api("run/" + id); break; }
      catch (e) { fail(head, e); if (STATIC) return; await new Promise((ok) => setTimeout(ok, POLL_MS)); }
    }
    const sections = new Map();
    const drawHead = () => head.replaceChildren(
      el("h1", {}, run.run), el("p", {}, `run ${run.id}, `, el("span", { class: "st-" + run.status, id: "status" }, run.status),
        `, ${run.ranks} ranks on ${run.nodes ?? "?"} node(s), ${dur(run.duration_s)}, last step ${run.last_step ?? "-"}, transport ${run.transport ?? "-"}`));
    drawHead();
    const addSections = () => {
      for (const name of run.keys.concat(run.timing)) if (!sections.has(name)) {
        const sec = seriesSection(id, name, run.nodes_of);
        sections.set(name, sec);
        charts.append(sec.node);
      }
    };
    addSections();
    async function loadAll() { for (const sec of sections.values()) await sec.load(); }
    await loadAll();
    document.body.dataset.drawn = "1";
    await loadFindings(id, found, sections);
    await logsSection(id, logs);
    if (STATIC) return;
    // Live: every POLL_MS the header alone (milliseconds for the server); the charts are fetched
    // again when the run moved, at most once per REDRAW_SHARE x what the last redraw took, so that
    // the page never takes more than ~1/REDRAW_SHARE of a core from the training it watches.
    let token = JSON.stringify([run.status, run.last_step, run.last_time]), busy = false, lastFindings = Date.now();
    let nextRedraw = 0;
    setInterval(async () => {
      if (busy) return;
      busy = true;
      try {
        const head = await api("run/" + id + "?brief=1");
        const now = JSON.stringify([head.status, head.last_step, head.last_time]);
        const ended = run.status !== head.status;
        if (now !== token && (ended || Date.now() >= nextRedraw)) {
          const t0 = Date.now();
          token = now; run = await api("run/" + id); drawHead(); addSections(); await loadAll();
          if (ended || Date.now() - lastFindings > 15000) { lastFindings = Date.now(); await loadFindings(id, found, sections); await logsSection(id, logs); }
          nextRedraw = Date.now() + REDRAW_SHARE * (Date.now() - t0);
          setLive(head.status === "running" ? "live: drawn at " + new Date().toLocaleTimeString() : "");
        }
      } catch (e) { setLive(e.message); }
      busy = false;
    }, POLL_MS);
  }

  async function loadFindings(id, where, sections) {
    let f;
    try { f = await api("run/" + id + "/findings"); } catch (e) { fail(where, e); return; }
    const link = (name, text) => el("li", {}, sections.has(name) ? el("a", { href: "#" + anchor(name) }, text) : text);
    const items = [
      ...f.outliers.map((o) => link(o.key, `${o.key}: rank ${o.rank} departs from the ranks' median from step ${o.first_step} to ${o.last_step} (${num(o.spreads)}x the typical spread)`)),
      ...f.non_finite.map((n) => link(n.key, `${n.key}: rank ${n.rank} logged NaN/inf first at step ${n.first_step} (${n.count} values)`)),
      ...f.stragglers.map((s) => link("timing:" + s.phase + "_s", `rank ${s.rank}: ${s.phase} ${num(s.excess_s * 1e3)} ms longer per step than the other ranks, from step ${s.first_step}`)),
      // StepTimer's memory (its RSS chart), or the metric key DeviceStatsMonitor logged it under (report/findings.py)
      ...f.memory.map((m) => link(m.measure.startsWith("DeviceStatsMonitor") ? m.measure : "timing:rss", `rank ${m.rank}: peak ${m.measure} ${num(m.peak_bytes / 2 ** 20)} MiB (others' median ${num(m.others_median_bytes / 2 ** 20)} MiB)`)),
      ...f.decisions.map((d) => el("li", {}, el("a", { href: "#logs" }, `step ${d.step} ${d.callback}: the ranks voted differently`))),
      ...f.log_messages.map((m) => el("li", {}, el("a", { href: "#logs" }, `${m.level} on ranks ${m.ranks} (${m.count}x): ${m.message}`))),
    ];
    where.replaceChildren(el("h2", {}, "Findings"), items.length ? el("ul", {}, items) : el("p", {}, "Nothing stands out."),
      ...f.notes.map((n) => el("p", { class: "muted" }, n)));
    // each chart names the ranks these findings name under its series (the report's one judgement)
    for (const [name, sec] of sections) await sec.flag((f.departing || {})[name] || []);
    document.body.dataset.judged = "1";
  }

  const anchor = (name) => "s-" + name.replace(/[^A-Za-z0-9_-]/g, "_");

  function seriesSection(id, name, nodesOf) {
    const band = el("div", { class: "band" }), heat = el("div", { class: "heat" }), note = el("p", { class: "muted" });
    const node = el("section", { class: "series", id: anchor(name), "data-series": name }, el("h2", {}, name), band, heat, note);
    // departing: the ranks the findings name here; named: their lines the series' answer lacked
    let data = null, extra = {}, departing = [], named = {};
    function draw() {
      const flaggedLines = Object.assign({}, data.lines, named);
      const lines = Object.assign({}, flaggedLines, extra);
      const flagged = Object.keys(flaggedLines);
      node.dataset.flagged = flagged.join(",");
      band.replaceChildren();
      bandChart(band, data.steps, data.band, lines);
      heat.replaceChildren();
      heatmap(heat, data, showRank);
      note.textContent = (departing.length ? "ranks departing: " + departing.join(", ") + ". " : "") +
        (data.non_finite.length ? "NaN/inf on ranks: " + data.non_finite.join(", ") + ". " : "") +
        (flagged.length ? "" : "No rank stands out. ") + `Buckets of ${data.width} step(s). Click a heatmap row for that rank's line.`;
    }
    async function lineOf(rank) {
      if (data.all_lines) {
        const all = new Float32Array(b64bytes(data.all_lines).buffer);
        const row = data.ranks.indexOf(rank), n = data.steps.length;
        return Array.from(all.slice(row * n, row * n + n), (v) => (isNaN(v) ? null : v));
      }
      return (await api(`run/${id}/line?name=${encodeURIComponent(name)}&rank=${rank}`)).values;
    }
    async function showRank(rank) {
      try { extra[rank] = await lineOf(rank); }
      catch (e) { note.textContent = e.message; return; }
      draw();
    }
    async function nameDeparting() {  // the departing ranks' lines, at most MAX_FLAGGED of them
      named = {};
      for (const rank of departing.slice(0, MAX_FLAGGED)) {
        if (String(rank) in data.lines || !data.ranks.includes(rank)) continue;
        try { named[rank] = await lineOf(rank); } catch (e) { /* the line route says why on a click */ }
      }
    }
    async function load() {
      try { data = await api(`run/${id}/series?name=${encodeURIComponent(name)}`); }
      catch (e) { fail(band, e); return; }
      if (data.departing) departing = data.departing;  // the HTML report's: its findings came first
      if (departing.length) await nameDeparting();
      draw();
      if (!document.body.dataset.firstRender) document.body.dataset.firstRender = Math.round(performance.now());
    }
    async function flag(ranks) {
      departing = ranks;
      if (!data) return;
      await nameDeparting();
      draw();
    }
    return { node, load, flag };
  }

  // every line 1 px wide or less: a wider one is stroked as a polygon, ~40x slower without a GPU
  // (headless Chromium, measured: 30 lines of 2,000 points 3.5 s at 1.5 px, 0.07 s at 1 px)
  function bandChart(where, steps, b, lines) {
    const series = [{ label: "step" },
      { label: "min", stroke: "#aaa", width: 0.5 }, { label: "q1", stroke: "#9ecae1", width: 0.5 },
      { label: "median", stroke: "#08519c", width: 1 }, { label: "q3", stroke: "#9ecae1", width: 0.5 }, { label: "max", stroke: "#aaa", width: 0.5 }];
    const data = [steps, b.lo, b.q1, b.median, b.q3, b.hi];
    Object.entries(lines).forEach(([rank, values], i) => {
      series.push({ label: "rank " + rank, stroke: LINE_COLOURS[i % LINE_COLOURS.length], width: 1 });
      data.push(values);
    });
    const opts = {
      width: Math.max(300, where.clientWidth || 900), height: 240, series, scales: { x: { time: false } },
      bands: [{ series: [5, 1], fill: "rgba(120,120,120,0.12)" }, { series: [4, 2], fill: "rgba(33,113,181,0.22)" }],
      // past MAX_LEGEND lines a legend row per rank is a wall of text (and costs the most to draw)
      legend: { show: Object.keys(lines).length <= MAX_LEGEND, live: true }, cursor: { drag: { x: true, y: false } },
    };
    return new uPlot(opts, data, where);
  }

  // heatmap colours: blue below the ranks' median, red above, saturated at 8 typical spreads (the
  // report's departure threshold); black: a NaN or inf there; light grey: no value
  const LUT = (() => {
    const lut = new Uint8ClampedArray(256 * 3);
    for (let code = -128; code < 128; code++) {
      let rgb;
      if (code === 127) rgb = [0, 0, 0];
      else if (code === -128) rgb = [235, 235, 235];
      else {
        const t = Math.pow(Math.min(1, Math.abs(code / 10) / 8), 0.75);
        const end = code < 0 ? [33, 102, 172] : [178, 24, 43];
        rgb = end.map((e) => Math.round(255 + (e - 255) * t));
      }
      lut.set(rgb, (code + 128) * 3);
    }
    return lut;
  })();
  const LUT32 = (() => {
    const rgba = new Uint8ClampedArray(256 * 4);
    for (let i = 0; i < 256; i++) rgba.set([LUT[3 * i], LUT[3 * i + 1], LUT[3 * i + 2], 255], 4 * i);
    return new Uint32Array(rgba.buffer);
  })();

  // base64 to bytes: a plain loop (Uint8Array.from with a mapping function is ~10x slower on 2 MB)
  function b64bytes(text) {
    const bin = atob(text), out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }

  function heatmap(where, d, onRow) {
    const R = d.ranks.length, C = d.steps.length;
    if (!R || !C) return;
    const codes = new Int8Array(b64bytes(d.heatmap).buffer);
    const off = document.createElement("canvas");
    off.width = C; off.height = R;
    const octx = off.getContext("2d"), img = octx.createImageData(C, R);
    const pixels = new Uint32Array(img.data.buffer);  // one write per cell (RGBA in the platform's byte order, as LUT32)
    for (let i = 0; i < codes.length; i++) pixels[i] = LUT32[codes[i] + 128];
    octx.putImageData(img, 0, 0);
    const label = 90, width = Math.max(300, where.clientWidth || 900), plotW = width - label;
    const height = Math.min(1024, Math.max(120, R * 3)), dpr = window.devicePixelRatio || 1;
    const cv = el("canvas", { class: "heatmap", "data-ranks": R, "data-columns": C });
    cv.width = width * dpr; cv.height = (height + 20) * dpr;
    cv.style.width = width + "px"; cv.style.height = height + 20 + "px";
    const ctx = cv.getContext("2d");
    ctx.scale(dpr, dpr);
    ctx.imageSmoothingEnabled = R > height; // more ranks than pixel rows: average them, never drop a row
    ctx.drawImage(off, 0, 0, C, R, label, 0, plotW, height);
    ctx.font = "11px sans-serif"; ctx.fillStyle = "#333"; ctx.strokeStyle = "#555";
    let row = 0;
    const labelled = d.nodes.length > 1 && d.nodes.length * 12 <= height;
    for (const [nodeName, count] of d.nodes) {
      const y0 = (row / R) * height, y1 = ((row + count) / R) * height;
      if (row > 0 && d.nodes.length <= 256) { ctx.beginPath(); ctx.moveTo(label - 6, y0); ctx.lineTo(width, y0); ctx.stroke(); }
      if (labelled) ctx.fillText(String(nodeName).slice(0, 14), 2, (y0 + y1) / 2 + 4);
      row += count;
    }
    if (!labelled) for (const i of [0, Math.floor(R / 2), R - 1]) ctx.fillText("rank " + d.ranks[i], 2, ((i + 0.5) / R) * height + 4);
    // a NaN/inf cell is one pixel of thousands: ring it so that it cannot be missed
    ctx.strokeStyle = "#000"; ctx.lineWidth = 1.5;
    let rings = 0;
    for (let i = 0; i < codes.length && rings < 200; i++) if (codes[i] === 127) {
      const x = label + ((i % C) + 0.5) / C * plotW, y = (Math.floor(i / C) + 0.5) / R * height;
      ctx.beginPath(); ctx.arc(x, y, 5, 0, 2 * Math.PI); ctx.stroke(); rings++;
    }
    ctx.lineWidth = 1;
    [[0, "left"], [Math.floor(C / 2), "center"], [C - 1, "right"]].forEach(([j, align]) => {
      ctx.textAlign = align;
      ctx.fillText("step " + d.steps[j], align === "left" ? label : align === "right" ? width : label + ((j + 0.5) / C) * plotW, height + 14);
    });
    const nodeOf = [];
    for (const [nodeName, count] of d.nodes) for (let i = 0; i < count; i++) nodeOf.push(nodeName);
    const tip = el("div", { class: "tip" });
    const cell = (ev) => {
      const r = cv.getBoundingClientRect(), x = ev.clientX - r.left - label, y = ev.clientY - r.top;
      if (x < 0 || y < 0 || y >= height) return null;
      return [Math.min(R - 1, Math.floor((y / height) * R)), Math.min(C - 1, Math.floor((x / plotW) * C))];
    };
    cv.addEventListener("mousemove", (ev) => {
      const at = cell(ev);
      if (!at) { tip.style.display = "none"; return; }
      const code = codes[at[0] * C + at[1]], rank = d.ranks[at[0]], s0 = d.steps[at[1]];
      const what = code === 127 ? "NaN or inf here" : code === -128 ? "no value" : num(code / 10) + " typical spreads from the ranks' median";
      tip.textContent = `rank ${rank} (${nodeOf[at[0]]}, steps ${s0}–${s0 + d.width - 1}): ${what}`;
      tip.style.display = "block"; tip.style.top = ev.offsetY + 12 + "px";
      tip.style.left = (ev.offsetX > width / 2 ? ev.offsetX - tip.offsetWidth - 12 : ev.offsetX + 12) + "px";
    });
    cv.addEventListener("mouseleave", () => { tip.style.display = "none"; });
    cv.addEventListener("click", (ev) => { const at = cell(ev); if (at) onRow(d.ranks[at[0]]); });
    where.append(cv, tip);
  }

  // -- decisions and logs -----------------------------------------------------------------
  async function logsSection(id, where) {
    let d;
    try { d = await api("run/" + id + "/logs"); } catch (e) { fail(where, e); return; }
    const rankBox = el("input", { type: "text", placeholder: "all ranks", size: 8, id: "rank-filter" });
    const level = el("select", { id: "level-filter" }, ...["DEBUG", "INFO", "WARNING", "ERROR"].map((l) => el("option", { value: l }, l + "+")));
    level.value = "INFO";
    const body = el("div");
    const show = () => {
      const ranks = rankBox.value.split(/[ ,]+/).filter(Boolean).map(Number);
      const keep = (r) => !ranks.length || ranks.includes(r.rank);
      const dec = d.decisions.filter(keep), logs = d.logs.filter((r) => keep(r) && r.levelno >= LEVELS[level.value]);
      body.replaceChildren(
        el("h3", {}, `Decisions (${dec.length})`), table(dec, ["step", "callback", "monitor", "rank", "value", "vote", "decision"]),
        el("h3", {}, `Log records (${logs.length})`), table(logs.slice(-500), ["rank", "level", "logger", "message"]));
    };
    rankBox.addEventListener("input", show); level.addEventListener("change", show);
    where.replaceChildren(el("h2", {}, "Decisions and logs"), el("label", {}, "ranks ", rankBox), " ", el("label", {}, "level ", level), body);
    show();
  }
  function table(rows, cols) {
    if (!rows.length) return el("p", { class: "muted" }, "none");
    return el("table", {}, el("tr", {}, cols.map((c) => el("th", {}, c))),
      rows.map((r) => el("tr", {}, cols.map((c) => el("td", {}, typeof r[c] === "number" ? num(r[c]) : String(r[c] ?? "-"))))));
  }

  // -- compare ----------------------------------------------------------------------------
  async function comparePage(a, b) {
    main.replaceChildren(el("h1", {}, `Compare runs ${a} and ${b}`));
    let ra, rb;
    try { [ra, rb] = await Promise.all([api("run/" + a), api("run/" + b)]); } catch (e) { fail(main, e); return; }
    main.append(el("p", {}, `A: ${ra.run} (${ra.ranks} ranks), B: ${rb.run} (${rb.ranks} ranks): each key's median and quartile band across ranks.`));
    const keys = ra.keys.filter((k) => rb.keys.includes(k));
    if (!keys.length) main.append(el("p", { class: "error" }, "The two runs share no key."));
    for (const key of keys) {
      const box = el("div", { class: "band" });
      main.append(el("section", { class: "series", "data-series": key }, el("h2", {}, key), box));
      try {
        const [da, db] = await Promise.all([api(`run/${a}/series?name=${encodeURIComponent(key)}`), api(`run/${b}/series?name=${encodeURIComponent(key)}`)]);
        const steps = Array.from(new Set(da.steps.concat(db.steps))).sort((x, y) => x - y);
        const at = (d, arr) => { const m = new Map(d.steps.map((s, i) => [s, arr[i]])); return steps.map((s) => m.get(s) ?? null); };
        const series = [{ label: "step" }], data = [steps];
        for (const [tag, d, colour] of [["A", da, "#08519c"], ["B", db, "#d62728"]]) {
          series.push({ label: tag + " q3", stroke: colour, width: 0.3 }, { label: tag + " median", stroke: colour, width: 1 }, { label: tag + " q1", stroke: colour, width: 0.3 });
          data.push(at(d, d.band.q3), at(d, d.band.median), at(d, d.band.q1));
        }
        new uPlot({ width: Math.max(300, box.clientWidth || 900), height: 240, series, scales: { x: { time: false } },
          bands: [{ series: [1, 3], fill: "rgba(8,81,156,0.15)" }, { series: [4, 6], fill: "rgba(214,39,40,0.15)" }] }, data, box);
      } catch (e) { fail(box, e); }
    }
    document.body.dataset.drawn = "1";
  }

  window.MRL_DRAW = { bandChart, heatmap };  // for benchmarks/bench_ui.py's render timings

  // -- route ------------------------------------------------------------------------------
  const where = STATIC ? STATIC.route : location.pathname;
  const m = where.match(/^\/run\/(\d+)$/);
  const q = new URLSearchParams(location.search);
  const started = m ? runPage(m[1]) : where === "/compare" ? comparePage(q.get("a"), q.get("b")) : runsPage();
  started.catch((e) => fail(main, e));
})();
