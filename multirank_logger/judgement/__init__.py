"""The one judgement of a rank: whether it departs from the others, straggles or stands out in
peak memory (``ranks.py``), its first NaN/inf on a key (``non_finite.py``), where a problem several ranks show started
(``origin.py``), a finding as a typed record (``finding.py``) and in words (``sentences.py``), decided over plain NumPy arrays and
dicts.

No SQL, no I/O, no pandas: the report (over one pass of a run's rows), the page (through the
report's findings) and the watch during training (``live.py``, over the windows it holds) all call
the same functions, with no knowledge of where the arrays came from.
"""
