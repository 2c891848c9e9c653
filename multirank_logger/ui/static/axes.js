/* multirank-logger ui: how a chart's values and steps read (units, ticks, axis widths, smoothing).
 * Loaded before app.js, which takes these as window.MRL_AXES; no state of its own. */
"use strict";
window.MRL_AXES = (function () {
  // -- units: a series' values as a person reads them (StepTimer's seconds and bytes) ------------
  const unitOf = (name) => (/^timing:(rss|mem_)/.test(name) ? "B" : /^timing:.*_s$/.test(name) ? "s" : "");
  function trimmed(v, digits) {  // at most `digits` significant digits, no trailing zeros
    return String(+v.toPrecision(digits));
  }
  function shortNum(v) {  // a tick: 25k, 1.2M, 0.001, 2e-5: never more than ~6 characters
    if (v === null || v === undefined) return "";  // log axes leave some places empty
    const a = Math.abs(v);
    if (v === 0) return "0";
    if (a >= 1e15 || a < 1e-4) return v.toExponential(1).replace("e+", "e");
    for (const [size, suffix] of [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]]) if (a >= size * 10 || (a >= size && suffix !== "k")) return trimmed(v / size, 3) + suffix;
    return trimmed(v, 4);
  }
  function withUnit(v, unit) {
    if (v === null || v === undefined || Number.isNaN(v)) return "-";
    if (unit === "B") {
      const a = Math.abs(v);
      const [size, name] = a >= 2 ** 30 ? [2 ** 30, "GiB"] : a >= 2 ** 20 ? [2 ** 20, "MiB"] : a >= 2 ** 10 ? [2 ** 10, "KiB"] : [1, "B"];
      return trimmed(v / size, 4) + " " + name;
    }
    if (unit === "s") {
      const a = Math.abs(v);
      return a === 0 ? "0 s" : a < 1e-3 ? trimmed(v * 1e6, 3) + " µs" : a < 1 ? trimmed(v * 1e3, 3) + " ms" : a < 120 ? trimmed(v, 3) + " s" : trimmed(v / 60, 3) + " min";
    }
    return shortNum(v);
  }
  // the y axis' tick labels in one unit for the whole axis (the largest tick's), so they compare
  function yTicks(unit) {
    return (u, splits) => {
      if (unit && splits.some((v) => v === null)) return splits.map((v) => (v === null ? "" : withUnit(v, unit)));
      if (unit === "B") {
        const top = Math.max(...splits.map(Math.abs));
        const [size, name] = top >= 2 ** 30 ? [2 ** 30, "GiB"] : top >= 2 ** 20 ? [2 ** 20, "MiB"] : top >= 2 ** 10 ? [2 ** 10, "KiB"] : [1, "B"];
        return splits.map((v) => trimmed(v / size, 4) + " " + name);
      }
      if (unit === "s") {
        const top = Math.max(...splits.map(Math.abs));
        const [size, name] = top >= 120 ? [60, "min"] : top >= 1 ? [1, "s"] : top >= 1e-3 ? [1e-3, "ms"] : [1e-6, "µs"];
        return splits.map((v) => trimmed(v / size, 4) + " " + name);
      }
      return splits.map(shortNum);
    };
  }
  // an axis as wide as its longest label (uPlot's fixed 50 px cut "25,000" to "5,000")
  function fitAxis(u, values, axisIdx, cycleNum) {
    const axis = u.axes[axisIdx];
    if (cycleNum > 1) return axis._size;
    let size = axis.ticks.size + axis.gap + 6;
    const longest = (values || []).reduce((a, v) => (String(v).length > a.length ? String(v) : a), "");
    if (longest) { u.ctx.font = axis.font[0]; size += u.ctx.measureText(longest).width / (window.devicePixelRatio || 1); }
    return Math.ceil(Math.max(size, 72));  // room for the heatmap's labels below: "rank 1023", a host
  }
  // steps are integers: ticks at 1, 2, 5 x 10^k only (never 0.5), labelled 1,500 or 1.5M
  const STEP_INCRS = [];
  for (let p = 1; p <= 1e18; p *= 10) STEP_INCRS.push(p, 2 * p, 5 * p);
  const stepTicks = (u, splits) => splits.map((v) => (Math.abs(v) >= 1e6 ? shortNum(v) : v.toLocaleString("en-US")));
  const xAxis = () => ({ incrs: STEP_INCRS, values: stepTicks, space: 60, size: 30 });
  // bytes: ticks at round KiB, MiB, GiB (1, 2, 5 x 10^k of them), not at 619.9 MiB
  const BYTE_INCRS = [];
  for (const base of [1, 2 ** 10, 2 ** 20, 2 ** 30, 2 ** 40]) for (const m of [1, 2, 5, 10, 20, 50, 100, 200, 500]) BYTE_INCRS.push(m * base);
  const yAxis = (unit, log) => (unit === "B" && !log ? { values: yTicks(unit), size: fitAxis, incrs: BYTE_INCRS } : { values: yTicks(unit), size: fitAxis });

  // TensorBoard's smoothing: exponential moving average, debiased at the start; nulls stay null
  function smoothed(values, weight) {
    if (!weight || !values) return values;
    let last = 0, n = 0;
    return values.map((v) => {
      if (v === null || v === undefined || !Number.isFinite(v)) return v;
      last = last * weight + (1 - weight) * v; n++;
      return last / (1 - Math.pow(weight, n));
    });
  }
  // log y: values at or below 0 have no place on it (left out, said under the chart)
  const positive = (values) => values.map((v) => (v === null || v === undefined || v <= 0 ? null : v));
  const sparse = (values) => values.filter((v) => v !== null && v !== undefined).length < values.length / 2;

  return { unitOf, withUnit, xAxis, yAxis, smoothed, positive, sparse, shortNum };
})();
