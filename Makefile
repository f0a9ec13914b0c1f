# Two entry points for a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/rhlab: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev]"
	touch $(BIN)/rhlab

.PHONY: venv demo test bench
venv: $(BIN)/rhlab

demo: venv
	$(BIN)/rhlab demo

test: venv
	$(BIN)/python -m pytest -q

bench: venv
	$(BIN)/python benchmarks/step_speed.py
