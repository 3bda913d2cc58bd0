# Two commands for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test lint clean

install: $(STAMP)

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/train_multi30k.py

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
