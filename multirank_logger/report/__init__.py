"""Which rank is the problem: findings computed from the query side, rendered as text, HTML and plots.

Example::

    from multirank_logger import open_store
    from multirank_logger.report import find

    with open_store("runs.sqlite") as reader:
        found = find(reader, run="lightning_logs/version_3")   # a Findings
"""

from multirank_logger.report.findings import Findings, find

__all__ = ["Findings", "find"]
