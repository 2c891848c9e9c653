/* multirank-logger ui: a key's band chart: its ranks' spread per bucket (min-max, quartiles,
 * median) and the lines of ranks drawn over it, with uPlot, as the toolbar says (log y, smoothing). */
(function () {
  "use strict";
  const { VIEW } = window.MRL_PAGE;
  const { withUnit, xAxis, yAxis, smoothed, positive, sparse } = window.MRL_AXES;
  const MAX_LEGEND = 32;
  // the colours of ranks' lines, in the order they are drawn
  const LINE_COLOURS = ["#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#2ca02c"];

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

  window.MRL_BAND_CHART = { LINE_COLOURS, bandChart, loggedColumns };
})();
