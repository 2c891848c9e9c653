/* multirank-logger ui: one key's section of a run's page: its band chart and heatmap, folded
 * to one line when the key is constant, the lines of the ranks the findings name (at most
 * MAX_FLAGGED) and of the ranks a person clicks in the heatmap. */
(function () {
  "use strict";
  const { VIEW, CHARTS, api, el, fail, b64bytes } = window.MRL_PAGE;
  const { unitOf, withUnit } = window.MRL_AXES;
  const { LINE_COLOURS, bandChart, loggedColumns } = window.MRL_BAND_CHART;
  const { heatmap } = window.MRL_HEATMAP;
  const MAX_FLAGGED = 8;  // departing ranks whose lines a chart draws (ui/views.py's MAX_FLAGGED)

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

  window.MRL_SERIES_SECTION = { anchor, seriesSection };
})();
