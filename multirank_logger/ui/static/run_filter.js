/* multirank-logger ui: the runs list's filter box and hyperparameters (app.js's runsPage calls it).
 * A filter is words, each of which a run must match: KEY=VALUE matches its hyperparameter KEY as
 * `multirank-logger runs --param KEY=VALUE` does (query/run_filter.py: a string as its text, a
 * number as its value, lr=3e-4 and lr=0.0003 alike, anything else as its JSON text); any other
 * word is found in the run's label (name/version) or status, in any case. A run's params come
 * flat, each leaf by its path (model/param_path.py: optimizer.lr, "key.with.dot"), so KEY is
 * that path, matched whole. */
(function () {
  "use strict";
  const has = (o, k) => o !== null && typeof o === "object" && Object.prototype.hasOwnProperty.call(o, k);
  // a hyperparameter as `runs --show-params` prints it: a string as it is, anything else as JSON
  const paramText = (v) => (typeof v === "string" ? v : JSON.stringify(v));
  function number(text) {
    if (!/\S/.test(text)) return null;
    const n = Number(text);
    return Number.isFinite(n) ? n : null;
  }
  function paramMatches(params, key, value) {
    if (!has(params, key)) return false;
    const held = params[key];
    if (paramText(held) === value) return true;
    const wanted = number(value);
    return typeof held === "number" && wanted !== null && held === wanted;
  }
  function matches(run, filter) {
    const words = String(filter || "").trim().split(/\s+/).filter(Boolean);
    const said = (run.run + " " + run.status).toLowerCase();
    return words.every((word) => {
      const eq = word.indexOf("=");
      return eq > 0 ? paramMatches(run.params, word.slice(0, eq), word.slice(eq + 1)) : said.includes(word.toLowerCase());
    });
  }
  // a run's hyperparameters as key=value texts, in the stored (sorted) order
  const paramPairs = (params) => Object.entries(params || {}).map(([k, v]) => k + "=" + paramText(v));
  window.MRL_RUN_FILTER = { matches, paramPairs, paramText };
})();
