/* multirank-logger ui: the runs list's filter box and hyperparameters (app.js's runsPage calls it).
 * A filter is words, each of which a run must match: KEY=VALUE matches its hyperparameter KEY as
 * `multirank-logger runs --param KEY=VALUE` does (query/run_filter.py: a string as its text, a
 * number as its value, lr=3e-4 and lr=0.0003 alike, anything else as its JSON text); any other
 * word is found in the run's label (name/version) or status, in any case. A run's params come
 * flat, each leaf by its path (rows/param_path.py: optimizer.lr, "key.with.dot"), so KEY is
 * read as that path (splitPath, then dotted: "opt" and opt name one key) and matched whole.
 * The words are cut at spaces outside double quotes, so "my key"=1 is one word: the rule of
 * param_path.split_words, which cuts `runs --show-params` at its commas. splitWords, splitPath,
 * splitKeyValue and dotted are param_path's functions written again (tests/query/test_find_runs.py
 * checks they agree on any text). */
(function () {
  "use strict";
  const has = (o, k) => o !== null && typeof o === "object" && Object.prototype.hasOwnProperty.call(o, k);
  // param_path: the white space a filter is cut at, and what makes a key be written in quotes
  const SPACES = " \t\n\r";
  const QUOTED_WHEN = '."\\=, \t\n\r';

  // `text` cut at each of `separators` outside double quotes, the words as written (param_path.split_words)
  function splitWords(text, separators) {
    const words = [];
    let start = 0, quoted = false;
    for (let i = 0; i < text.length; i++) {
      const ch = text[i];
      if (quoted && ch === "\\") { i++; continue; }
      if (ch === '"') quoted = !quoted;
      else if (!quoted && separators.includes(ch)) { words.push(text.slice(start, i)); start = i + 1; }
    }
    words.push(text.slice(start));
    return words.filter((w) => w.length);
  }
  // KEY=VALUE split at the first '=' outside a quoted key (param_path.split_key_value); null without one
  function splitKeyValue(text) {
    let quoted = false;
    for (let i = 0; i < text.length; i++) {
      const ch = text[i];
      if (quoted && ch === "\\") { i++; continue; }
      if (ch === '"') quoted = !quoted;
      else if (ch === "=" && !quoted) return [text.slice(0, i), text.slice(i + 1)];
    }
    return null;
  }
  // a dotted path as its keys (param_path.split_path); null where that raises
  function splitPath(text) {
    const keys = [];
    let i = 0;
    const n = text.length;
    for (;;) {
      let key;
      if (i < n && text[i] === '"') {
        key = "";
        let j = i + 1, closed = false;
        while (j < n) {
          if (text[j] === "\\" && j + 1 < n) { key += text[j + 1]; j += 2; }
          else if (text[j] === '"') { closed = true; j += 1; break; }
          else { key += text[j]; j += 1; }
        }
        if (!closed) return null;
        i = j;
      } else {
        let end = text.indexOf(".", i);
        if (end < 0) end = n;
        key = text.slice(i, end);
        i = end;
        if (!key.length) return null;
      }
      keys.push(key);
      if (i === n) return keys;
      if (text[i] !== ".") return null;
      i += 1;
      if (i === n) return null;
    }
  }
  // the keys as one path (param_path.dotted)
  const segment = (k) => (k.length && ![...k].some((c) => QUOTED_WHEN.includes(c)) ? k
    : '"' + k.replace(/\\/g, "\\\\").replace(/"/g, '\\"') + '"');
  const dotted = (keys) => keys.map(segment).join(".");

  // a hyperparameter as `runs --show-params` prints it: a string as it is, anything else as JSON
  const paramText = (v) => (typeof v === "string" ? v : JSON.stringify(v));
  function number(text) {
    if (!/\S/.test(text)) return null;
    const n = Number(text);
    return Number.isFinite(n) ? n : null;
  }
  function paramMatches(params, key, value) {
    const path = splitPath(key);
    if (path === null || !has(params, dotted(path))) return false;
    const held = params[dotted(path)];
    if (paramText(held) === value) return true;
    const wanted = number(value);
    return typeof held === "number" && wanted !== null && held === wanted;
  }
  // a word of the name or status: a quoted one ("my run") as its text
  function nameWord(word) {
    const path = word[0] === '"' ? splitPath(word) : null;
    return (path !== null && path.length === 1 ? path[0] : word).toLowerCase();
  }
  function matches(run, filter) {
    const words = splitWords(String(filter || "").trim(), SPACES);
    const said = (run.run + " " + run.status).toLowerCase();
    return words.every((word) => {
      const kv = splitKeyValue(word);
      return kv && kv[0].length ? paramMatches(run.params, kv[0], kv[1]) : said.includes(nameWord(word));
    });
  }
  // a run's hyperparameters as key=value texts, in the stored (sorted) order
  const paramPairs = (params) => Object.entries(params || {}).map(([k, v]) => k + "=" + paramText(v));
  window.MRL_RUN_FILTER = { matches, paramPairs, paramText, splitWords, splitKeyValue, splitPath, dotted, SPACES };
})();
