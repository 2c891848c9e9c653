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
  const RUN_COLOURS = ["#08519c", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
  // how every chart draws (a toolbar above the charts): log y, and TensorBoard's smoothing (a
  // debiased exponential moving average, 0: none)
  const VIEW = { log: false, smooth: 0 };
  const CHARTS = {};  // series -> its uPlot chart (the tests read its axes and scales)
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
  // a duration as `multirank-logger runs` and `report` write it (_util/readable.py): 4.2s, 21s, 1m30s, 2h05m00s
  function dur(s) {
    if (s === null || s === undefined || Number.isNaN(s)) return "-";
    if (Math.abs(s) < 10) return s.toFixed(1) + "s";
    const t = Math.round(s), h = Math.floor(t / 3600), m = Math.floor((t % 3600) / 60), sec = t % 60, two = (n) => String(n).padStart(2, "0");
    return h ? `${h}h${two(m)}m${two(sec)}s` : m ? `${m}m${two(sec)}s` : `${sec}s`;
  }
  const when = (t) => (t ? new Date(t * 1000).toLocaleString() : "-");
  const runHref = (id) => (STATIC ? "#" : "/run/" + id);

  // how values and steps read: static/axes.js
  const { unitOf, withUnit, xAxis, yAxis, smoothed, positive, sparse } = window.MRL_AXES;
  function fail(where, err) { where.replaceChildren(el("p", { class: "error" }, err.message || String(err))); }
  function setLive(text) { liveNote.textContent = text; }

  // -- the runs ---------------------------------------------------------------------------
  // every run listed (also a store's only one: the list says what the store holds), with its
  // first hyperparameters; the filter box keeps the runs whose name, status or key=value match
  // (static/run_filter.js, the rule of `runs --param`); tick runs to overlay them, each key's
  // median and quartile band per run
  const { matches, paramPairs, splitKeyValue } = window.MRL_RUN_FILTER;
  const PARAMS_SHOWN = 4;  // key=value pairs a row shows; all of them in its tooltip
  async function runsPage() {
    const table = el("table", { id: "runs" });
    const button = el("button", { type: "button", id: "overlay", disabled: "" }, "Overlay the ticked runs");
    const compare = el("p", { id: "compare" }, button, " ", el("span", { class: "muted" }, "tick two runs or more"));
    const box = el("input", { type: "search", id: "run-filter", size: 40, placeholder: "filter: name, status, key=value (lr=0.001)",
                              title: "Words all of which a run matches: key=value a hyperparameter, any other word its name or status" });
    const count = el("span", { id: "run-count", class: "muted" });
    box.value = new URLSearchParams(location.search).get("filter") || "";
    main.replaceChildren(el("h1", {}, "Runs"), el("p", { id: "filter" }, box, " ", count), table, compare);
    let listed = [];
    function filter() {
      const rows = [...table.querySelectorAll("tr[data-run]")];
      const kept = new Set(listed.filter((r) => matches(r, box.value)).map((r) => String(r.id)));
      rows.forEach((tr) => { tr.hidden = !kept.has(tr.dataset.run); });
      count.textContent = box.value.trim() ? `${kept.size} of ${listed.length} runs` : "";
    }
    box.addEventListener("input", () => {
      filter();
      if (!STATIC) history.replaceState(null, "", box.value.trim() ? "?filter=" + encodeURIComponent(box.value.trim()) : location.pathname);
    });
    const ticked = new Set();
    let shown = "";
    const ready = () => {
      button.disabled = ticked.size < 2;
      compare.dataset.runs = [...ticked].join(",");
    };
    button.addEventListener("click", () => { location.href = "/compare?runs=" + [...ticked].sort((x, y) => x - y).join(","); });
    async function refresh() {
      let runs;
      try { runs = await api("runs"); } catch (e) { shown = ""; fail(table, e); return; }
      const token = JSON.stringify(runs);
      if (token === shown) return;
      if (!shown && runs.length >= 2) runs.slice(0, 2).forEach((r) => ticked.add(r.id));  // the two newest, at first
      shown = token;
      const tick = (r) => {
        const box = el("input", { type: "checkbox", name: "run", value: r.id, title: "overlay this run" });
        box.checked = ticked.has(r.id);
        box.addEventListener("change", () => { if (box.checked) ticked.add(r.id); else ticked.delete(r.id); ready(); });
        return box;
      };
      const varying = differing(runs);
      table.replaceChildren(
        el("tr", {}, ...["id", "run", "status", "ranks", "nodes", "duration", "last step", "transport", "started", "params", STATIC ? "" : "overlay"].map((h) => el("th", {}, h))),
        ...runs.map((r) => el("tr", { "data-run": r.id },
          el("td", {}, r.id), el("td", {}, el("a", { href: runHref(r.id) }, r.run)), el("td", { class: "st-" + r.status }, r.status, r.stopped_by ? el("div", { class: "muted" }, r.stopped_by) : null),
          el("td", {}, r.ranks), el("td", {}, r.nodes ?? "-"), el("td", {}, dur(r.duration_s)), el("td", {}, r.last_step ?? "-"),
          el("td", {}, r.transport ?? "-"), el("td", {}, when(r.started)), paramsCell(r.params, varying), el("td", {}, STATIC ? null : tick(r)))));
      listed = runs;
      filter();
      compare.hidden = runs.length < 2;
      ready();
    }
    await refresh();
    document.body.dataset.drawn = "1";
    if (!STATIC) setInterval(refresh, POLL_MS);
  }
  // the hyperparameters whose values differ between the runs listed (what tells them apart)
  function differing(runs) {
    const seen = {}, some = runs.filter((r) => Object.keys(r.params || {}).length);  // a run logging none tells nothing
    some.forEach((r) => paramPairs(r.params).forEach((p) => { const k = splitKeyValue(p)[0]; (seen[k] = seen[k] || new Set()).add(p); }));
    return new Set(Object.keys(seen).filter((k) => seen[k].size > 1 || some.some((r) => !(k in r.params))));
  }
  // a run's first PARAMS_SHOWN hyperparameters as key=value, those that differ between runs first
  function paramsCell(params, varying) {
    const key = (p) => splitKeyValue(p)[0];  // a quoted key may hold '='
    const pairs = paramPairs(params).sort((a, b) => varying.has(key(b)) - varying.has(key(a)));
    const more = pairs.length > PARAMS_SHOWN ? ` +${pairs.length - PARAMS_SHOWN} more` : "";
    return el("td", { class: "params", title: pairs.join("\n") || null }, pairs.length ? pairs.slice(0, PARAMS_SHOWN).join(" ") + more : "-");
  }

  // -- a run ------------------------------------------------------------------------------
  async function runPage(id) {
    const head = el("section", { id: "head" }), found = el("section", { id: "findings" }, el("h2", {}, "Findings"), el("p", { class: "muted" }, "computing…"));
    const charts = el("section", { id: "charts" }), logs = el("section", { id: "logs" });
    const tools = toolbar(() => { for (const sec of sections.values()) sec.redraw(); });
    main.replaceChildren(head, found, tools, charts, logs);
    let run;
    for (;;) {  // a store being created, or a run not there yet: say so, and look again
      try { run = await api("run/" + id); break; }
      catch (e) {  // the error alone: no "computing…" under it for a run that may never come
        fail(head, e); found.hidden = tools.hidden = true;
        if (STATIC) return;
        await new Promise((ok) => setTimeout(ok, POLL_MS));
      }
    }
    found.hidden = tools.hidden = false;
    const sections = new Map();
    const drawHead = () => head.replaceChildren(
      el("h1", {}, run.run), el("p", {}, `run ${run.id}, `, el("span", { class: "st-" + run.status, id: "status" }, run.status),
        `, ${run.ranks} ranks on ${run.nodes ?? "?"} node(s), ${dur(run.duration_s)}, last step ${run.last_step ?? "-"}, transport ${run.transport ?? "-"}`),
      // why it ended where it did, as the report's first line says it (StopOnAlert's decision)
      run.stopped_by ? el("p", { id: "stopped" }, run.stopped_by[0].toUpperCase() + run.stopped_by.slice(1) + ": the fit ended there on every rank.") : "");
    drawHead();
    const addSections = () => {
      for (const name of run.keys.concat(run.timing)) if (!sections.has(name)) {
        const sec = seriesSection(id, name, run.nodes_of);
        sections.set(name, sec);
        charts.append(sec.node);
      }
    };
    addSections();
    // the findings asked at once: the server's pass over the run runs while the charts load, not after them
    const asked = api("run/" + id + "/findings");
    asked.catch(() => {});  // its error is said where the findings go (loadFindings)
    async function loadAll() { for (const sec of sections.values()) await sec.load(); }
    await loadAll();
    document.body.dataset.drawn = "1";
    await loadFindings(id, found, sections, asked);
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

  async function loadFindings(id, where, sections, asked) {
    let f;
    try { f = await (asked || api("run/" + id + "/findings")); } catch (e) { fail(where, e); return; }
    const link = (name, text) => el("li", {}, sections.has(name) ? el("a", { href: "#" + anchor(name) }, text) : text);
    const items = [
      // each finding's one sentence and series (judgement/sentences.py), origins first (judgement/origin.py)
      // the ranks one sentence says together (every rank of a host at one step): their first item says it
      ...[...f.non_finite, ...f.outliers, ...f.stragglers, ...f.memory].filter((x) => x.said_with == null).map((x) => {
        const item = link(x.series, x.sentence);
        if (x.place) item.append(el("span", { class: "muted place" }, "; " + x.place));  // where it lives (judgement/places.py)
        if (x.cost) item.append(el("span", { class: "muted cost" }, "; " + x.cost));  // what it cost, beside the sentence
        if (x.spread) item.classList.add(x.origin ? "origin" : "follower");
        return item;
      }),
      ...f.decisions.map((d) => el("li", {}, el("a", { href: "#logs" }, `step ${d.step} ${d.callback}: the ranks voted differently`))),
      ...f.log_messages.map((m) => el("li", {}, el("a", { href: "#logs" }, `${m.level} on ranks ${m.ranks} (${m.count}x): ${m.message}`))),
    ];
    where.replaceChildren(el("h2", {}, "Findings"), items.length ? el("ul", {}, items) : el("p", {}, "Nothing stands out."),
      ...f.notes.map((n) => el("p", { class: "muted" }, n)));
    // each chart names the ranks these findings name under its series (the report's one judgement)
    for (const [name, sec] of sections) await sec.flag((f.departing || {})[name] || [], (f.origins || {})[name] || []);
    document.body.dataset.judged = "1";
  }

  // log scale and smoothing for every chart of the page; how to zoom, said once
  function toolbar(redraw, hint = "Drag across a chart to zoom in (its heatmap follows), double-click to zoom out; click a heatmap row to draw that rank.") {
    const log = el("input", { type: "checkbox", id: "log-scale" });
    const smooth = el("input", { type: "range", id: "smoothing", min: 0, max: 0.99, step: 0.01, value: VIEW.smooth });
    const shown = el("span", { class: "muted" }, String(VIEW.smooth));
    log.checked = VIEW.log;
    log.addEventListener("change", () => { VIEW.log = log.checked; redraw(); });
    smooth.addEventListener("input", () => { VIEW.smooth = +smooth.value; shown.textContent = smooth.value; redraw(); });
    return el("div", { id: "toolbar" }, el("label", {}, log, " log scale"), el("label", {}, "smoothing ", smooth, " ", shown),
      el("span", { class: "muted" }, hint));
  }

  const anchor = (name) => "s-" + name.replace(/[^A-Za-z0-9_-]/g, "_");

  function seriesSection(id, name, nodesOf) {
    const box = el("div", { class: "band" }), note = el("p", { class: "muted" });
    const node = el("section", { class: "series", id: anchor(name), "data-series": name }, el("h2", {}, name), box, note);
    const unit = unitOf(name);
    // departing: the ranks the findings name here; named: their lines the series' answer lacked
    // origins: the ranks where a problem several ranks show started (their heatmap rows are marked)
    let data = null, extra = {}, departing = [], origins = [], named = {}, codes = null;
    const colours = new Map();  // rank -> its colour, kept for the page's life: a click never recolours
    const colourOf = (rank) => {
      if (!colours.has(rank)) colours.set(rank, LINE_COLOURS[colours.size % LINE_COLOURS.length]);
      return colours.get(rank);
    };
    let opened = false;  // a constant key (the server's `folded`) is one line until clicked
    function foldedLine() {
      const f = data.folded, v = (x) => withUnit(x, unit);
      const text = `${name}: ` + (f.first === f.last ? `${v(f.first)} at every step` : `${v(f.first)} -> ${v(f.last)}`) +
        `, the same on every rank (steps ${f.from.toLocaleString("en-US")}-${f.to.toLocaleString("en-US")}; click to draw)`;
      const line = el("button", { type: "button", class: "folded" }, text);
      line.addEventListener("click", () => { opened = true; draw(); });
      node.replaceChildren(line);
      node.dataset.folded = "1";
    }
    function draw() {
      if (data.folded && !opened) return foldedLine();
      if (node.dataset.folded) { node.replaceChildren(el("h2", {}, name), box, note); node.dataset.folded = ""; }
      const flaggedLines = Object.assign({}, data.lines, named);
      const flagged = Object.keys(flaggedLines);
      // flagged ranks first (in the findings' order), then the clicked ones in click order
      const order = [...new Set([...departing.map(String).filter((r) => r in flaggedLines), ...flagged, ...Object.keys(extra)])];
      const lines = order.map((rank) => [rank, flaggedLines[rank] ?? extra[rank], colourOf(rank)]);
      node.dataset.flagged = flagged.join(",");
      box.replaceChildren();
      codes = codes || new Int8Array(b64bytes(data.heatmap).buffer);
      const chart = bandChart(box, data, lines, unit, loggedColumns(codes, data.ranks.length, data.steps.length));
      CHARTS[name] = chart;
      const heat = heatmap(box, data, codes, chart, showRank, origins, departing);
      const equal = codes.some((c) => c === 0) && codes.every((c) => c === 0 || c === -128);
      const skipped = VIEW.log && [data.band.lo, ...lines.map((l) => l[1])].some((v) => v && v.some((x) => x !== null && x <= 0));
      note.textContent = (departing.length ? "ranks departing: " + departing.join(", ") + ". " : "") +
        (data.non_finite.length ? "NaN/inf on ranks: " + data.non_finite.join(", ") + ". " : "") +
        (equal ? "Every rank logged the same values here. " : flagged.length ? "" : "No rank stands out. ") +
        (skipped ? (data.band.hi.some((x) => x !== null && x > 0) ? "Log scale: values at or below 0 are not drawn. " : "Log scale: no value above 0, drawn linear. ") : "") +
        `Buckets of ${data.width} step(s)` + (unit ? `; values in ${unit === "B" ? "bytes (KiB, MiB, GiB)" : "seconds"}` : "") + ".";
      node.dataset.equal = equal ? "1" : "";
      return heat;
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
      try { data = await api(`run/${id}/series?name=${encodeURIComponent(name)}`); codes = null; }
      catch (e) { fail(box, e); return; }
      if (data.departing) departing = data.departing;  // the HTML report's: its findings came first
      if (departing.length) await nameDeparting();
      draw();
      if (!document.body.dataset.firstRender) document.body.dataset.firstRender = Math.round(performance.now());
    }
    async function flag(ranks, started = []) {
      departing = ranks;
      origins = started;
      if (!data) return;
      await nameDeparting();
      draw();
    }
    const redraw = () => { if (data) draw(); };
    return { node, load, flag, redraw };
  }

  // a run's band (min-max grey, quartiles blue, median) with ranks' lines: [rank, values, colour].
  // Every line 1 px wide or less: a wider one is stroked as a polygon, ~40x slower without a GPU
  // (headless Chromium, measured: 30 lines of 2,000 points 3.5 s at 1.5 px, 0.07 s at 1 px).
  // A sparse series (a key logged at epoch ends) shows its points too; smoothing and log y as the
  // toolbar says.
  // `columns`: the buckets some rank logged the key in (`loggedColumns`), all when not given. Only
  // these are drawn, so a key logged every N steps is a line through its points; a null left in
  // them is a NaN/inf or a rank that did not log where others did: a break in the line, never bridged.
  function bandChart(where, d, lines, unit, columns = null) {
    const pick = columns ? (v) => Array.from(columns, (j) => v[j]) : (v) => v;
    const steps = pick(d.steps);
    const few = sparse(d.band.median);  // logged in under half the buckets: its points shown too
    // log y only where some value lies above 0 (else an empty chart): a key at 0 or below stays linear
    const log = VIEW.log && [d.band.hi, ...lines.map((l) => l[1])].some((v) => v && v.some((x) => x !== null && x > 0));
    const prep = (v) => { const out = smoothed(pick(v), VIEW.smooth); return log ? positive(out) : out; };
    const pts = { show: few, size: 6 };
    const series = [{ label: "step", value: (u, v) => (v === null ? "-" : v.toLocaleString("en-US")) },
      { label: "min", stroke: "#aaa", width: 0.5, spanGaps: false, points: { show: false } },
      { label: "q1", stroke: "#9ecae1", width: 0.5, spanGaps: false, points: { show: false } },
      { label: "median", stroke: "#08519c", width: 1, spanGaps: false, points: { ...pts, fill: "#08519c" } },
      { label: "q3", stroke: "#9ecae1", width: 0.5, spanGaps: false, points: { show: false } },
      { label: "max", stroke: "#aaa", width: 0.5, spanGaps: false, points: { show: false } }];
    for (const s of series.slice(1)) s.value = (u, v) => withUnit(v, unit);
    const b = d.band;
    const data = [steps, prep(b.lo), prep(b.q1), prep(b.median), prep(b.q3), prep(b.hi)];
    for (const [rank, values, colour] of lines) {
      series.push({ label: "rank " + rank, stroke: colour, width: 1, spanGaps: false, points: { ...pts, fill: colour }, value: (u, v) => withUnit(v, unit) });
      data.push(prep(values));
    }
    const first = steps[0], last = steps[steps.length - 1];
    const whole = [d.steps[0], d.steps[d.steps.length - 1] + d.width];
    const opts = {
      width: Math.max(300, where.clientWidth || 900), height: 240, series,
      // unzoomed, the x range is every bucket's, to where the last one ends: the heatmap's columns
      // line up under it (also where the first or last buckets hold no value of this key)
      scales: { x: { time: false, range: (u, lo, hi) => (lo === first && hi === last ? whole : [lo, hi]) },
                // one value everywhere (a key all 0): 1 either side of it, not uPlot's 0-100
                y: log ? { distr: 3 } : { range: (u, lo, hi) => (lo === hi ? [lo - (Math.abs(lo) || 1), hi + (Math.abs(hi) || 1)] : uPlot.rangeNum(lo, hi, 0.1, true)) } },
      axes: [xAxis(), yAxis(unit, log)],
      bands: [{ series: [5, 1], fill: "rgba(120,120,120,0.12)" }, { series: [4, 2], fill: "rgba(33,113,181,0.22)" }],
      // past MAX_LEGEND lines a legend row per rank is a wall of text (and costs the most to draw)
      legend: { show: lines.length <= MAX_LEGEND, live: true }, cursor: { drag: { x: true, y: false } },
    };
    return new uPlot(opts, data, where);
  }

  // the heatmap columns (buckets) where some rank logged the key, a value or a NaN/inf: a key logged
  // every N steps, or at epoch ends, leaves the others empty on every rank
  function loggedColumns(codes, R, C) {
    const out = [];
    for (let j = 0; j < C; j++) for (let i = 0; i < R; i++) if (codes[i * C + j] !== -128) { out.push(j); break; }
    return out.length ? out : null;
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
  // the strongest shade of a row the findings do not name (in tenths of a typical spread: 4 spreads, ~60% colour)
  const SHADE_MAX = 40;
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

  // the heatmap under its chart: its cells in the chart's plot area, step for step (the columns
  // follow the chart's zoom), the rank labels in the chart's y-axis gutter, a colour legend below
  function heatmap(where, d, codes, chart, onRow, origins = [], departing = []) {
    const R = d.ranks.length, C = d.steps.length;
    if (!R || !C) return null;
    // the NaN/inf cells to ring: each row's first (where it started on that rank), earliest first,
    // then the others; so the origin's row is ringed whatever the cap and the rows above it
    const firsts = [], rest = [];
    for (let i = 0; i < R; i++) {
      let first = true;
      for (let j = 0; j < C; j++) if (codes[i * C + j] === 127) {
        if (first) firsts.push(i * C + j); else if (rest.length < 200) rest.push(i * C + j);
        first = false;
      }
    }
    firsts.sort((a, b) => (a % C) - (b % C) || a - b);
    const ringed = firsts.concat(rest);
    const originRows = origins.map((r) => d.ranks.indexOf(r)).filter((i) => i >= 0);
    // a key logged every N steps or at epoch ends: a column no rank logged shows the nearest logged
    // one, never a column of grey (grey stays for a rank that did not log where others did)
    const src = new Int32Array(C);
    const present = loggedColumns(codes, R, C) || [];
    for (let j = 0; j < C; j++) src[j] = j;
    const filled = present.length && present.length < C;
    if (filled) {
      let k = 0;
      for (let j = 0; j < C; j++) {
        while (k + 1 < present.length && Math.abs(present[k + 1] - j) <= Math.abs(present[k] - j)) k++;
        src[j] = present[k];
      }
    }
    const off = document.createElement("canvas");
    off.width = C; off.height = R;
    const octx = off.getContext("2d"), img = octx.createImageData(C, R);
    const pixels = new Uint32Array(img.data.buffer);  // one write per cell (RGBA in the platform's byte order, as LUT32)
    // full colour means a departure the findings name, nothing else: a row they do not name is drawn
    // at most at SHADE_MAX (its tooltip keeps the value); the verdict decides, not this page
    const named = new Set(departing.map(Number));
    for (let i = 0; i < R; i++) {
      const full = named.has(d.ranks[i]);
      for (let j = 0; j < C; j++) {
        const code = codes[i * C + (filled ? src[j] : j)];
        pixels[i * C + j] = LUT32[(full || code === 127 || code === -128 ? code : Math.max(-SHADE_MAX, Math.min(SHADE_MAX, code))) + 128];
      }
    }
    octx.putImageData(img, 0, 0);
    const dpr = window.devicePixelRatio || 1;
    // rows a person can point at up to 32 ranks (8 px), then 3 px a rank up to 1,024 px
    const width = chart.width, height = Math.min(1024, Math.max(60, R <= 32 ? R * 8 : R * 3));
    let label = 0, plotW = 0;  // the chart's plot area, read again at each of its draws (uPlot lays out later)
    const cv = el("canvas", { class: "heatmap", "data-ranks": R, "data-columns": C });
    cv.width = width * dpr; cv.height = height * dpr;
    cv.style.width = width + "px"; cv.style.height = height + "px";
    const ctx = cv.getContext("2d");
    ctx.scale(dpr, dpr);
    const legend = heatLegend();
    const xOf = (step) => label + chart.valToPos(step, "x");
    const nodeOf = [];
    for (const [nodeName, count] of d.nodes) for (let i = 0; i < count; i++) nodeOf.push(nodeName);
    const equal = codes.every((c) => c === 0 || c === -128) && codes.some((c) => c === 0);
    function paint() {
      label = chart.bbox.left / dpr; plotW = chart.bbox.width / dpr;
      cv.dataset.left = label; cv.dataset.plotWidth = plotW; legend.style.marginLeft = label + "px";
      ctx.clearRect(0, 0, width, height);
      ctx.save();
      ctx.beginPath(); ctx.rect(label, 0, plotW, height); ctx.clip();
      ctx.imageSmoothingEnabled = R > height; // more ranks than pixel rows: average them, never drop a row
      const x0 = xOf(d.steps[0]), x1 = xOf(d.steps[C - 1] + d.width);
      ctx.drawImage(off, 0, 0, C, R, x0, 0, x1 - x0, height);
      ctx.restore();
      // a NaN/inf cell is one pixel of thousands: ring it so that it cannot be missed (whole, also
      // at the plot's edge; none outside the zoomed range)
      ctx.strokeStyle = "#000"; ctx.lineWidth = 1.5;
      let rings = 0;
      const ringedRows = new Set();
      for (let k = 0; k < ringed.length && rings < 200; k++) {
        const i = ringed[k];
        const x = xOf(d.steps[i % C] + d.width / 2), y = Math.min(height - 6, Math.max(6, (Math.floor(i / C) + 0.5) / R * height));
        if (x < label - 1 || x > label + plotW + 1) continue;
        ctx.beginPath(); ctx.arc(x, y, 5, 0, 2 * Math.PI); ctx.stroke(); rings++;
        ringedRows.add(d.ranks[Math.floor(i / C)]);
      }
      cv.dataset.ringed = [...ringedRows].sort((a, b) => a - b).join(",");
      // the origin's row: a marker in the label gutter, at any zoom (the verdict's, not a rule here)
      ctx.fillStyle = "#b2182b";
      for (const i of originRows) {
        const y = Math.min(height - 5, Math.max(5, ((i + 0.5) / R) * height));
        ctx.beginPath(); ctx.moveTo(label - 9, y - 5); ctx.lineTo(label - 1, y); ctx.lineTo(label - 9, y + 5); ctx.closePath(); ctx.fill();
      }
      cv.dataset.origins = originRows.map((i) => d.ranks[i]).join(",");
      ctx.lineWidth = 1; ctx.font = "11px sans-serif"; ctx.fillStyle = "#333"; ctx.strokeStyle = "#555"; ctx.textAlign = "right";
      let row = 0;
      const labelled = d.nodes.length > 1 && d.nodes.length * 12 <= height;
      const fit = (text) => { let t = String(text); while (t.length > 3 && ctx.measureText(t).width > label - 8) t = t.slice(0, -2) + "…"; return t; };
      for (const [nodeName, count] of d.nodes) {
        const y0 = (row / R) * height, y1 = ((row + count) / R) * height;
        if (row > 0 && d.nodes.length <= 256) { ctx.beginPath(); ctx.moveTo(label - 4, y0); ctx.lineTo(label + plotW, y0); ctx.stroke(); }
        if (labelled) ctx.fillText(fit(String(nodeName).replace(/ \(node \d+\)$/, "")), label - 6, (y0 + y1) / 2 + 4);
        row += count;
      }
      if (!labelled) {
        const rows = R <= Math.floor(height / 12) ? d.ranks.map((_, i) => i) : [0, Math.floor(R / 2), R - 1];
        for (const i of rows) ctx.fillText(fit("rank " + d.ranks[i]), label - 6, Math.min(height - 2, Math.max(10, ((i + 0.5) / R) * height + 4)));
      }
      ctx.strokeStyle = "#ccc"; ctx.strokeRect(label + 0.5, 0.5, plotW - 1, height - 1);
      if (equal) {  // white everywhere is an answer, not a drawing that failed: say it
        ctx.textAlign = "center"; ctx.fillStyle = "#666";
        ctx.fillText("every rank logged the same value at every step", label + plotW / 2, height / 2 + 4);
      }
    }
    // painted at each of the chart's draws: its first (uPlot lays a new chart out a moment after
    // it is made, and only then is its plot area known), each zoom, each resize
    chart.hooks.draw = (chart.hooks.draw || []).concat(paint);
    const tip = el("div", { class: "tip" });
    const cell = (ev) => {
      const r = cv.getBoundingClientRect(), x = ev.clientX - r.left, y = ev.clientY - r.top;
      if (x < label || x > label + plotW || y < 0 || y >= height) return null;
      const step = chart.posToVal(x - label, "x"), j = Math.floor((step - d.steps[0]) / d.width);
      if (j < 0 || j >= C) return null;
      return [Math.min(R - 1, Math.floor((y / height) * R)), src[j]];
    };
    cv.addEventListener("mousemove", (ev) => {
      const at = cell(ev);
      if (!at) { tip.style.display = "none"; return; }
      const code = codes[at[0] * C + at[1]], rank = d.ranks[at[0]], s0 = d.steps[at[1]];
      const what = code === 127 ? "NaN or inf here" : code === -128 ? "no value" : code === 0 ? "at the ranks' median" : num(Math.abs(code) / 10) + " typical spreads " + (code < 0 ? "below" : "above") + " the ranks' median";
      const steps = d.width > 1 ? `steps ${s0}–${s0 + d.width - 1}` : `step ${s0}`;
      const gpu = d.gpus && d.gpus[at[0]] ? ", " + d.gpus[at[0]] : "";  // the place: host, then GPU and mesh coordinates
      tip.textContent = `rank ${rank} (${nodeOf[at[0]]}${gpu}, ${steps}): ${what}`;
      tip.style.display = "block"; tip.style.top = ev.offsetY + 12 + "px";
      tip.style.left = (ev.offsetX > width / 2 ? ev.offsetX - tip.offsetWidth - 12 : ev.offsetX + 12) + "px";
    });
    cv.addEventListener("mouseleave", () => { tip.style.display = "none"; });
    cv.addEventListener("click", (ev) => { const at = cell(ev); if (at) onRow(d.ranks[at[0]]); });
    const wrap = el("div", { class: "heat" }, cv, tip, legend);
    // right under the chart's plot and x axis, above its legend (moved under the heading by CSS)
    chart.root.insertBefore(wrap, chart.root.querySelector(".u-legend"));
    return cv;
  }

  // what a heatmap's colours say: a gradient from -8 to +8 typical spreads, and the two other cells
  function heatLegend() {
    const bar = el("canvas", { class: "scale", width: 160, height: 10 });
    const ctx = bar.getContext("2d");
    for (let x = 0; x < 160; x++) {
      const code = Math.round((x / 159) * 160 - 80), i = (code + 128) * 3;
      ctx.fillStyle = `rgb(${LUT[i]},${LUT[i + 1]},${LUT[i + 2]})`; ctx.fillRect(x, 0, 1, 10);
    }
    const swatch = (colour) => el("span", { class: "swatch", style: "background:" + colour });
    return el("div", { class: "heat-legend" },
      el("span", {}, "below the ranks' median −8"), bar, el("span", {}, "+8 above"),
      el("span", { class: "muted" }, "(typical spreads, the report's yardstick; full colour: a departure the findings name)"),
      swatch("#000"), el("span", {}, "NaN/inf"), swatch("rgb(235,235,235)"), el("span", {}, "no value"));
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
      // the terminal's words (`multirank-logger decisions`): yes/no, saved/not saved, stop/continue
      const dec = d.decisions.filter(keep).map((r) => {
        const [done, notDone] = DECIDED[r.callback] || ["yes", "no"];
        return { ...r, vote: r.vote === null ? "-" : r.vote ? "yes" : "no", decision: r.decision === null ? "-" : r.decision ? done : notDone };
      });
      const logs = d.logs.filter((r) => keep(r) && r.levelno >= LEVELS[level.value]);
      body.replaceChildren(
        el("h3", {}, `Decisions (${dec.length})`), table(dec, ["step", "callback", "monitor", "rank", "value", "vote", "decision"]),
        el("h3", {}, `Log records (${logs.length})`), table(logs.slice(-500), ["rank", "level", "logger", "message"], "logs"));
    };
    rankBox.addEventListener("input", show); level.addEventListener("change", show);
    where.replaceChildren(el("h2", {}, "Decisions and logs"), el("label", {}, "ranks ", rankBox), " ", el("label", {}, "level ", level), body);
    show();
  }
  const DECIDED = { ModelCheckpoint: ["saved", "not saved"], EarlyStopping: ["stop", "continue"] };
  function table(rows, cols, kind) {
    if (!rows.length) return el("p", { class: "muted" }, "none");
    // a message keeps its lines (Lightning's model summary is a table of its own)
    const cellOf = (r, c) => (c === "message" ? el("td", {}, el("pre", { class: "message" }, String(r[c] ?? "")))
      : el("td", {}, typeof r[c] === "number" ? num(r[c]) : String(r[c] ?? "-")));
    return el("table", { class: kind || null }, el("tr", {}, cols.map((c) => el("th", {}, c))),
      rows.map((r) => el("tr", {}, cols.map((c) => cellOf(r, c)))));
  }

  // -- several runs overlaid --------------------------------------------------------------
  // each key any of them logged: per run its quartile band, and a line: its median, or the rank
  // a person picks for it (run A's rank 3 against run B's rank 3 or median); x: step, or the
  // wall time since each run's start (its clock: /api/run/ID/clock). Kept in the URL:
  // /compare?runs=1,2&rank=1:3,2:3&x=time
  async function comparePage(ids) {
    main.replaceChildren(el("h1", {}, `Runs ${ids.join(", ")} overlaid`));
    if (ids.length < 1) { fail(main, new Error("Name the runs: /compare?runs=1,2,3 (tick them in the runs list).")); return; }
    let runs;
    try { runs = await Promise.all(ids.map((id) => api("run/" + id))); } catch (e) { fail(main, e); return; }
    const colour = (i) => RUN_COLOURS[i % RUN_COLOURS.length];
    const q = new URLSearchParams(location.search);
    const picked = new Map((q.get("rank") || "").split(",").map((p) => p.split(":")).filter((p) => p.length === 2 && /^\d+$/.test(p[1])).map(([id, r]) => [id, +r]));
    let axis = q.get("x") === "time" ? "time" : "step";
    const keep = () => {  // the choices in the URL: a reload or a link shows the same
      const u = new URLSearchParams(location.search);
      const ranks = [...picked].map(([id, r]) => id + ":" + r).join(",");
      if (ranks) u.set("rank", ranks); else u.delete("rank");
      if (axis === "time") u.set("x", "time"); else u.delete("x");
      history.replaceState(null, "", "?" + u.toString().replace(/%2C/g, ",").replace(/%3A/g, ":"));
    };
    const pickers = runs.map((r, i) => {
      const choose = el("select", { class: "pick-rank", "data-run": r.id, title: "the line drawn for this run" },
        el("option", { value: "" }, "median"), ...Array.from({ length: r.ranks || 0 }, (_, k) => el("option", { value: k }, "rank " + k)));
      choose.value = picked.has(String(r.id)) ? String(picked.get(String(r.id))) : "";
      choose.addEventListener("change", () => { if (choose.value === "") picked.delete(String(r.id)); else picked.set(String(r.id), +choose.value); keep(); redrawAll(); });
      return [el("span", { class: "swatch", style: "background:" + colour(i) }), el("a", { href: runHref(r.id) }, `${r.id}: ${r.run}`),
        ` (${r.ranks} ranks, ${r.status}) `, choose, "  "];
    });
    const xPick = el("select", { id: "x-axis" }, el("option", { value: "step" }, "step"), el("option", { value: "time" }, "wall time since each run's start"));
    xPick.value = axis;
    xPick.addEventListener("change", () => { axis = xPick.value; keep(); redrawAll(); });
    main.append(el("p", { id: "overlaid" }, ...pickers.flat()), el("p", {}, el("label", {}, "x axis ", xPick)),
      el("p", { class: "muted" }, "Each run's quartiles across its ranks (band) and its median, or the rank picked for it (line)."));
    const names = [...new Set(runs.flatMap((r) => r.keys.concat(r.timing)))];
    const redraws = [];
    const redrawAll = () => redraws.forEach((f) => f());
    main.append(toolbar(redrawAll, "Drag across a chart to zoom in, double-click to zoom out."));
    const clocks = {};  // run id -> its clock, asked once, when the wall-time axis is first drawn
    // a bucket's time: the clock at its last step (the latest value logged in its last summary bucket)
    const timeAt = (clock, step) => {
      let lo = 0, hi = clock.steps.length - 1, found = null;
      while (lo <= hi) { const mid = (lo + hi) >> 1; if (clock.steps[mid] <= step) { found = mid; lo = mid + 1; } else hi = mid - 1; }
      return found === null ? null : clock.seconds[found];
    };
    for (const name of names) {
      const box = el("div", { class: "band" }), unit = unitOf(name);
      main.append(el("section", { class: "series", "data-series": name }, el("h2", {}, name), box));
      const has = runs.map((r, i) => [r, i]).filter(([r]) => r.keys.includes(name) || r.timing.includes(name));
      const lines = {};  // "run:rank" -> the rank's line of this key, asked once
      let got;
      try { got = await Promise.all(has.map(([r]) => api(`run/${r.id}/series?name=${encodeURIComponent(name)}`))); } catch (e) { fail(box, e); continue; }
      let drawing = 0;
      // as the toolbar and the pickers say: smoothing, log y, each run's line, the x axis; drawn at
      // once from what was asked before (the toolbar's change shows in the same task), else once
      // the lines and clocks it needs have come (the newest choice wins)
      const draw = () => {
        const lineKey = (r) => r.id + ":" + picked.get(String(r.id));
        const asks = [];
        for (const [r] of has) {
          if (picked.has(String(r.id)) && !(lineKey(r) in lines)) {
            asks.push(api(`run/${r.id}/line?name=${encodeURIComponent(name)}&rank=${picked.get(String(r.id))}`).then((v) => { lines[lineKey(r)] = v; }));
          }
          if (axis === "time" && !(r.id in clocks)) asks.push(api(`run/${r.id}/clock`).then((v) => { clocks[r.id] = v; }));
        }
        const mine = ++drawing;
        if (asks.length) return Promise.all(asks).then(() => (mine === drawing ? draw() : null), (e) => fail(box, e));
        render(has.map(([r]) => (picked.has(String(r.id)) ? lines[lineKey(r)] : null)), axis === "time" ? has.map(([r]) => clocks[r.id]) : null);
        return Promise.resolve();
      };
      const render = (picks, clockList) => {
        const xsOf = (d, k) => d.steps.map((s) => (clockList ? timeAt(clockList[k], s + (d.width || 1) - 1) : s));
        const xs = got.map(xsOf);
        const xAll = Array.from(new Set(xs.flat().filter((x) => x !== null))).sort((x, y) => x - y);
        const at = (k, arr) => { const m = new Map(xs[k].map((x, j) => [x, arr[j]])); return xAll.map((x) => m.get(x) ?? null); };
        const prep = (v) => { const out = smoothed(v, VIEW.smooth); return VIEW.log ? positive(out) : out; };
        const series = [{ label: axis === "time" ? "seconds" : "step" }], data = [xAll], bands = [];
        got.forEach((d, k) => {
          const [r, i] = has[k], c = colour(i), base = series.length, pick = picks[k];
          series.push({ label: `${r.id} q3`, stroke: c, width: 0.3, spanGaps: true, points: { show: false } },
            { label: pick ? `${r.id}: ${r.run} rank ${pick.rank}` : `${r.id}: ${r.run}`, stroke: c, width: pick ? 1.5 : 1, spanGaps: true },
            { label: `${r.id} q1`, stroke: c, width: 0.3, spanGaps: true, points: { show: false } });
          for (const s of series.slice(base)) s.value = (u, v) => withUnit(v, unit);
          data.push(prep(at(k, d.band.q3)), prep(at(k, pick ? pick.values : d.band.median)), prep(at(k, d.band.q1)));
          bands.push({ series: [base, base + 2], fill: c + "26" });
        });
        box.replaceChildren();
        const x = axis === "time" ? { values: (u, splits) => splits.map(dur), space: 70, size: 30 } : xAxis();
        CHARTS[name] = new uPlot({ width: Math.max(300, box.clientWidth || 900), height: 240, series,
          scales: { x: { time: false }, y: VIEW.log ? { distr: 3 } : {} }, axes: [x, yAxis(unit, VIEW.log)], bands }, data, box);
        box.dataset.x = axis;
        box.dataset.lines = has.map(([r], k) => r.id + ":" + (picks[k] ? picks[k].rank : "median")).join(",");
      };
      redraws.push(draw);
      box.dataset.runs = has.map(([r]) => r.id).join(",");
      await draw();
    }
    document.body.dataset.drawn = "1";
  }

  window.MRL_DRAW = {  // for benchmarks/bench_ui.py's render timings: the page's own drawing, on made-up data
    bandChart: (where, steps, band, lines) => bandChart(where, { steps, band, width: 1 },
      Object.entries(lines).map(([rank, values], i) => [rank, values, LINE_COLOURS[i % LINE_COLOURS.length]]), ""),
    chartFor: (where, d) => { const none = d.steps.map(() => null); return bandChart(where, { ...d, band: { lo: none, q1: none, median: none, q3: none, hi: none } }, [], ""); },
    heatmap: (where, d, chart, onRow) => heatmap(where, d, new Int8Array(b64bytes(d.heatmap).buffer), chart, onRow),
  };
  window.MRL_CHARTS = CHARTS;  // for benchmarks/bench_ui.py's render timings

  // -- route ------------------------------------------------------------------------------
  const where = STATIC ? STATIC.route : location.pathname;
  const m = where.match(/^\/run\/(\d+)$/);
  const q = new URLSearchParams(location.search);
  // /compare?runs=1,2,3 (and the older ?a=1&b=2)
  const compared = (q.get("runs") || [q.get("a"), q.get("b")].filter(Boolean).join(",")).split(",").filter((x) => /^\d+$/.test(x));
  const started = m ? runPage(m[1]) : where === "/compare" ? comparePage([...new Set(compared)]) : runsPage();
  started.catch((e) => fail(main, e));
})();
