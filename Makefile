# Two commands for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo reproduce test lint clean

install: $(STAMP)

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/train_multi30k.py

# The published Transformer-tiny recipe on Multi30k (examples/reproduce_multi30k.py), three seeds, then their
# mean and spread: hours on a CPU. An interrupted run continues when the target is run again.
REPRO := runs/reproduce
reproduce: $(STAMP)
	for seed in 0 1 2; do $(PY) examples/reproduce_multi30k.py --seed $$seed --output $(REPRO)/seed$$seed || exit 1; done
	$(PY) examples/reproduce_multi30k.py --summarize $(REPRO)/seed0 $(REPRO)/seed1 $(REPRO)/seed2 \
		--json $(REPRO)/summary.json --plot $(REPRO)/curves.png

# The tests and every `>>>` example in the package's docstrings (--doctest-modules, pytest.ini);
# the 15 slowest are listed at the end. One pytest worker per CPU core (pytest-xdist): most tests
# trace and run tiny models, single-threaded work that two cores do side by side. `loadfile` keeps
# each test file in one worker, so a module's fixtures are built once.
test: lint
	$(PY) -m pytest tests keras_transformer -n auto --dist loadfile --durations=15

# Lint and format check (configuration in ruff.toml); `ruff format .` and `ruff check --fix .` repair most findings.
LINTED := keras_transformer tests examples benchmarks setup.py
lint: $(STAMP)
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
