/* multirank-logger ui: the runs, a run (findings, band charts, rank x step heatmaps, logs), compare.
 * Draws what the server sends (per-bucket summaries, one byte per heatmap cell), never rows.
 * In a self-contained report (window.MRL_STATIC) the same code reads the embedded answers.
 * This file routes the URL to its page; each concept is a script of its own, loaded before it
 * in ui/page.py's order (classic scripts, each exporting one window.MRL_* object, so the
 * self-contained report inlines them as they are): page.js (what every page shares),
 * band_chart.js, heatmap.js, series_section.js (a key's section), run_logs.js, run_page.js,
 * runs_page.js, compare_page.js; axes.js (units, ticks) and run_filter.js (the runs' filter). */
"use strict";
(function () {
  const { STATIC, CHARTS, main, fail, b64bytes } = window.MRL_PAGE;
  const { LINE_COLOURS, bandChart } = window.MRL_BAND_CHART;
  const { heatmap } = window.MRL_HEATMAP;
  const { runPage } = window.MRL_RUN_PAGE;
  const { runsPage } = window.MRL_RUNS_PAGE;
  const { comparePage } = window.MRL_COMPARE_PAGE;

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
