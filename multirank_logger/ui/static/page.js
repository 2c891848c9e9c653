/* multirank-logger ui: what every page shares: the store's answers (`api`: the server's, or
 * a self-contained report's embedded ones, window.MRL_STATIC), building elements, how numbers,
 * durations and times read, the toolbar every chart follows (log y, smoothing) and the charts
 * drawn (CHARTS: the tests read their axes and scales). Loaded first of the page's scripts. */
(function () {
  "use strict";

  const STATIC = window.MRL_STATIC || null;
  const POLL_MS = 2000;
  const main = document.getElementById("main");
  const liveNote = document.getElementById("live");
  // how every chart draws (a toolbar above the charts): log y, and TensorBoard's smoothing (a
  // debiased exponential moving average, 0: none)
  const VIEW = { log: false, smooth: 0 };
  const CHARTS = {};  // series -> its uPlot chart (the tests read its axes and scales)

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

  function fail(where, err) { where.replaceChildren(el("p", { class: "error" }, err.message || String(err))); }
  function setLive(text) { liveNote.textContent = text; }

  // base64 to bytes: a plain loop (Uint8Array.from with a mapping function is ~10x slower on 2 MB)
  function b64bytes(text) {
    const bin = atob(text), out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
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

  window.MRL_PAGE = { STATIC, POLL_MS, VIEW, CHARTS, main, api, el, num, dur, when, runHref, fail, setLive, b64bytes, toolbar };
})();
