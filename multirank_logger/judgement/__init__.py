"""The one judgement of a rank: whether it departs from the others, straggles, logged NaN/inf or
stands out in peak memory, decided over plain NumPy arrays (``judgement/ranks.py``).

No SQL, no I/O, no pandas: the report (over one pass of a run's rows), the live page (through the
report's findings) and a watch during training (over the windows it holds) all call the same
functions, with no knowledge of where the arrays came from.
"""
