/* multirank-logger ui: the alerts the watch raised, at the top of a run's page (/run/ID).
 * On its own, beside app.js: it fills <div id="alerts"> above <main> from /api/run/ID/alerts and
 * polls it while the page is open (the run's alerts arrive as it goes). In a self-contained
 * report (window.MRL_STATIC) it reads the embedded answer once. */
(function () {
  "use strict";
  const STATIC = window.MRL_STATIC || null;
  const POLL_MS = 2000;
  const box = document.getElementById("alerts");
  const route = STATIC ? STATIC.route : location.pathname;
  const m = /^\/run\/(\d+)\/?$/.exec(route);
  if (!box || !m) return;
  const path = "run/" + m[1] + "/alerts";
  let shown = -1;

  async function alerts() {
    if (STATIC) return STATIC.answers[path] || [];
    const r = await fetch("/api/" + path, { cache: "no-store" });
    if (!r.ok) return null;  // a store from before the alerts table, a run not there yet: nothing to show
    return r.json();
  }

  function draw(list) {
    if (list.length === shown) return;
    shown = list.length;
    box.replaceChildren();
    if (!list.length) { box.className = ""; return; }
    box.className = "alerts";
    const h = document.createElement("h2");
    h.textContent = `Alerts raised during the run (${list.length})`;
    const ul = document.createElement("ul");
    for (const a of list) {
      const li = document.createElement("li");
      li.className = "alert alert-" + a.kind;
      li.dataset.rank = a.rank;
      li.dataset.kind = a.kind;
      const when = a.seen_at ? new Date(a.seen_at * 1000).toLocaleTimeString() + " " : "";
      li.textContent = when + a.message;  // text, never HTML: a key is the user's string
      ul.append(li);
    }
    box.append(h, ul);
  }

  async function tick() {
    try { const list = await alerts(); if (list) draw(list); } catch (e) { /* the next tick tries again */ }
    if (!STATIC) setTimeout(tick, POLL_MS);
  }
  tick();
})();
