/* multirank-logger ui: a run's decisions (DecisionAudit) and log records, filtered by rank and
 * level, at the foot of its page. */
(function () {
  "use strict";
  const { api, el, num, fail } = window.MRL_PAGE;
  const LEVELS = { DEBUG: 10, INFO: 20, WARNING: 30, ERROR: 40, CRITICAL: 50 };
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

  window.MRL_RUN_LOGS = { logsSection };
})();
