# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# Each creates .venv when it is missing. torch 2.13.0 goes in first: that pin takes
# this machine's CPU wheel, where a bare `torch` would pull GBs of CUDA packages.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint browser java bytecode transformers-site bench bench-quick clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[test]"
	$(MAKE) --no-print-directory transformers-site
	touch $(STAMP)

# transformers beside the environment, not in it: where it is installed, torchmetrics (which Lightning
# imports) imports it in every process that imports Lightning, ~1.4 s of CPU of ~5.5 (python -X
# importtime -c "import lightning.pytorch"), and the suite starts hundreds of such processes (every rank
# of every launch) of which a handful use it. The test extra installs it with its dependencies (so pip
# resolves them together); this moves transformers alone (no dependencies) to $(VENV)/transformers-site,
# which the Transformers tests put on their path (tests/helpers/launches.py: TRANSFORMERS_SITE). `make test`
# runs it too, so a venv made before (or by pip by hand) is moved once; with transformers moved already, it does nothing
transformers-site:
	@v=$$($(PY) -c 'import importlib.metadata as m; print(m.version("transformers"))' 2>/dev/null) || exit 0; \
		rm -rf $(VENV)/transformers-site && \
		$(PY) -m pip install --quiet --no-deps --target $(VENV)/transformers-site "transformers==$$v" && \
		$(PY) -m pip uninstall --quiet --yes transformers

demo: $(STAMP)
	$(PY) examples/demo.py

# the suite's workers: its trainings are CPU-bound, and each already runs 2-8 processes
TEST_WORKERS ?= 2

# the 25 slowest tests are listed at the end: where the suite's time goes, in every CI log. Per module:
# PYTEST_ADDOPTS=--junitxml=run.xml make test, then benchmarks/suite_time.py run.xml [--before old.xml].
# --dist loadgroup: the tests that share a module-scoped fixture (a real training) run on one
# worker, so it is made once (tests/conftest.py groups them; plain load may cut a module between
# the workers, each then making its own); the other tests are spread one by one as before
test: lint transformers-site browser java bytecode
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=25

# the package's and the tests' bytecode, written once: the suite starts hundreds of Python processes
# (every rank of every launch), and where PYTHONDONTWRITEBYTECODE is set (this image sets it) each
# compiled the package anew, ~0.25 s of CPU a process. Python still reads bytecode under that variable,
# and checks it against its source's mtime, so an edit is never run stale
bytecode: $(STAMP)
	$(PY) -m compileall -q -j 0 multirank_logger tests examples benchmarks >/dev/null

# the HTML report and ui tests render pages in a real headless Chromium, the ui's through Selenium
# and chromedriver: installed when missing (Debian's packages; CI runs as root), so they never skip
browser:
	@{ command -v chromium && command -v chromedriver; } >/dev/null || { \
		sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq chromium chromium-driver >/dev/null; }

# Spark (pyspark 4, in local mode) reads the Parquet export in tests/export/test_export.py: it needs a Java
# runtime (17 or later), installed when missing (Debian's default-jre-headless: OpenJDK 17 on
# Debian 12, 21 on 13; CI runs as root), so the test never skips
java:
	@command -v java >/dev/null || { \
		sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq default-jre-headless >/dev/null; }

# ruff and mypy as configured in pyproject.toml (CI runs them through `make test`); mypy reads
# transformers' types where make put it (transformers-site, below)
lint: $(STAMP)
	$(PY) -m ruff check multirank_logger tests benchmarks examples migrations
	PYTHONPATH=$(VENV)/transformers-site $(PY) -m mypy

# every test but those in tests/runs/, the real multi-process trainings (`slow`: see tests/conftest.py)
test-fast: transformers-site bytecode
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -m "not slow"

bench: $(STAMP)
	$(PY) benchmarks/run.py

bench-quick: $(STAMP)
	$(PY) benchmarks/run.py --quick

clean:
	rm -rf $(VENV) demo_runs .pytest_cache
