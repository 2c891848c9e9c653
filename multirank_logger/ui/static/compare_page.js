/* multirank-logger ui: several runs overlaid (/compare?runs=ID,ID): per key each run's
 * quartile band and its median or a rank picked for it, on step or wall-time axes. */
(function () {
  "use strict";
  const { VIEW, CHARTS, main, api, el, dur, runHref, fail, toolbar } = window.MRL_PAGE;
  const { unitOf, withUnit, xAxis, yAxis, smoothed, positive } = window.MRL_AXES;
  const RUN_COLOURS = ["#08519c", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

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

  window.MRL_COMPARE_PAGE = { comparePage };
})();
