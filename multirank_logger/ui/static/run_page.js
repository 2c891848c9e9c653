/* multirank-logger ui: a run's page (/run/ID): its header, findings (the server's one
 * judgement, said in its sentences), a section per key, its decisions and logs; live while the
 * run goes, redrawn at most once per REDRAW_SHARE x what the last redraw took. */
(function () {
  "use strict";
  const { STATIC, POLL_MS, main, api, el, dur, fail, setLive, toolbar } = window.MRL_PAGE;
  const { anchor, seriesSection } = window.MRL_SERIES_SECTION;
  const { logsSection } = window.MRL_RUN_LOGS;
  const REDRAW_SHARE = 20;

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

  window.MRL_RUN_PAGE = { runPage };
})();
