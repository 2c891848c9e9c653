/* multirank-logger ui: the runs list (/): every run with its first hyperparameters, the filter
 * box (static/run_filter.js) and the runs ticked to overlay. */
(function () {
  "use strict";
  const { STATIC, POLL_MS, main, api, el, dur, when, runHref, fail } = window.MRL_PAGE;
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

  window.MRL_RUNS_PAGE = { runsPage };
})();
