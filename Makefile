# `make run` and `make test` work on a fresh machine: both create .venv and install first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-slow test-all lint format bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m runner

test: $(STAMP)
	$(PY) -m pytest

test-slow: $(STAMP)
	$(PY) -m pytest -m slow

test-all: $(STAMP)
	$(PY) -m pytest -m ''

# .pre-commit-config.yaml runs the same three commands.
lint: $(STAMP)
	$(PY) -m ruff format --check . && $(PY) -m ruff check . && $(PY) -m mypy

format: $(STAMP)
	$(PY) -m ruff format . && $(PY) -m ruff check --fix .

clean:
	rm -rf $(VENV) outputs
