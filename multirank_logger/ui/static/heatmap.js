/* multirank-logger ui: a key's rank x step heatmap under its band chart (one byte per cell
 * from the server: typical spreads from the ranks' median, NaN/inf, no value), drawn as one
 * ImageData scaled by the browser, with its colour legend. */
(function () {
  "use strict";
  const { el, num } = window.MRL_PAGE;
  const { loggedColumns } = window.MRL_BAND_CHART;
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

  window.MRL_HEATMAP = { heatmap };
})();
