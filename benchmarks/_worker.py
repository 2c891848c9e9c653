"""Child process entry: ``python -m benchmarks._worker '{"target": "mod:fn", "kwargs": {}, "inner": 3}'``.

Calls the measurement function `inner` times and prints one line
``BENCH-RESULT {"samples": [...], "extras": [...], "rss_mib": ...}`` on stdout. A
function may return its own ``rss_mib`` (a DDP run reports its largest rank's);
otherwise this process's peak RSS is used.
"""

from __future__ import annotations

import importlib
import json
import sys
import traceback
from typing import Any

from benchmarks._harness import _RESULT_MARK, Unavailable, peak_rss_mib


def measure(target: str, kwargs: dict[str, Any], inner: int) -> dict[str, Any]:
    module_name, func_name = target.split(":")
    try:
        func = getattr(importlib.import_module(module_name), func_name)
        samples, extras, rss = [], [], []
        for _ in range(inner):
            out = func(**kwargs)
            samples.append(float(out.pop("value")))
            if "rss_mib" in out:
                rss.append(float(out.pop("rss_mib")))
            extras.append(out)
    except Unavailable as exc:
        return {"error": f"not available: {exc}"}
    except Exception as exc:  # reported in the table, not fatal to the suite
        traceback.print_exc()
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"samples": samples, "extras": extras, "rss_mib": max(rss) if rss else peak_rss_mib()}


def main() -> None:
    spec = json.loads(sys.argv[1])
    result = measure(spec["target"], spec["kwargs"], spec["inner"])
    sys.stdout.flush()
    print(_RESULT_MARK + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
