"""The page's HTML: one shell for every route of the live server, and the same views written
into one self-contained file (``report -o FILE.html``).

Every script and style is the package's own (``ui/static/``: the page's scripts, ``app.css``, uPlot
1.6.32 with its MIT licence): nothing is fetched from a CDN, so the page works on an air-gapped
cluster. The self-contained file inlines them, with the answers the page would have asked the
server for (``window.MRL_STATIC``), so it draws the same charts from a file:// URL.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["STATIC", "page_html", "script_safe_json", "write_static_page"]

STATIC = Path(__file__).with_name("static")
#: classic scripts in the order they run, each exporting one ``window.MRL_*`` object that those
#: after it take (ES modules would not run from the self-contained file: a file:// page cannot
#: import them, and an inline module cannot import its siblings); app.js, last of the page's,
#: routes the URL to its page
_SCRIPTS = ("uPlot.iife.min.js", "axes.js", "run_filter.js", "page.js", "band_chart.js", "heatmap.js",
            "series_section.js", "run_logs.js", "run_page.js", "runs_page.js", "compare_page.js", "app.js",
            "alerts.js")
_STYLES = ("uPlot.min.css", "app.css")


def page_html(error: str | None = None) -> str:
    """The shell every route serves; ``app.js`` reads the URL and draws the page."""
    head = "".join(f'<link rel="stylesheet" href="/static/{name}">' for name in _STYLES)
    scripts = "".join(f'<script src="/static/{name}"></script>' for name in _SCRIPTS)
    body = f'<p class="error">{html.escape(error)}</p>' if error else ""
    return _shell("multirank-logger", head, body, "" if error else scripts)


def write_static_page(path: str | os.PathLike[str], title: str, answers: dict[str, Any], route: str,
                      run_uuid: str | None = None) -> None:
    """One HTML file holding the scripts, the styles and ``answers`` ({API path: its JSON});
    ``run_uuid`` shown in its header: the run's one identity, also when the file travels alone."""
    head = "".join(f"<style>{(STATIC / name).read_text()}</style>" for name in _STYLES)
    data = json.dumps({"route": route, "answers": answers}, allow_nan=False, separators=(",", ":"))
    # "</" inside a script element would end it early
    inline = [(STATIC / name).read_text().replace("</script", "<\\/script") for name in _SCRIPTS]
    scripts = "<script>window.MRL_STATIC=" + script_safe_json(data) + ";</script>"
    scripts += "".join(f"<script>{text}</script>" for text in inline)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(_shell(title, head, "", scripts, run_uuid, static=True))


def script_safe_json(text: str) -> str:
    """JSON text that a ``<script>`` element holds as it is: every ``<`` (so no ``</script``,
    no ``<!--`` and no ``<script``: after ``<!--<script`` the HTML parser ignores the next
    ``</script>``, and the page stayed blank), ``>`` and ``&`` as JSON escapes, and U+2028/2029
    (line ends to older JavaScript). Outside strings JSON has none of them: it reads back the same."""
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, escape)
    return text


def _shell(title: str, head: str, body: str, scripts: str, run_uuid: str | None = None, static: bool = False) -> str:
    uuid = f"<span id='run-uuid'>run {html.escape(run_uuid)}</span>" if run_uuid else ""
    # a file opened from disk has no server's "/" to go to (it went to file:///): no link there
    home = "<span id='home'>multirank-logger report</span>" if static else "<a href='/' id='home'>multirank-logger</a>"
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{html.escape(title)}</title>{head}</head>"
        f"<body><header>{home}<span id='live'></span>{uuid}</header>"
        f"<div id='alerts'></div><main id='main'>{body}</main>{scripts}</body></html>\n"
    )
