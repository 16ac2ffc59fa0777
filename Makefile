PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench bench-peers lint typecheck clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tft-jax demo

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=15

lint: $(STAMP)
	$(VENV)/bin/ruff check .

typecheck: $(STAMP)
	$(PY) -m pip install --quiet mypy
	$(PY) -m mypy

bench: $(STAMP)
	$(PY) -m benchmarks.cpu

bench-peers: $(STAMP)
	$(PY) -m pip install --quiet -e '.[test,peers]'
	$(PY) -m benchmarks.peer

clean:
	rm -rf $(VENV) .jax_cache .pytest_cache .hypothesis
