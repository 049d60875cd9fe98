# `make run` and `make test` work on a fresh machine: both create .venv and install first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test compiler test-slow test-all test-compat lint format docs docs-serve bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	@# uv resolves the same versions as pip in about a quarter of the time (measured on a clean cache:
	@# 46 s against ~160 s for pip); pip stays the fallback where uv cannot be installed.
	@# --compile-bytecode: uv, unlike pip, writes no .pyc files, and where PYTHONDONTWRITEBYTECODE is set (as on
	@# this project's machines) Python writes none either, so every process compiled MindSpore's ~2,000 modules from source:
	@# 3 s of each command (a TINY run 12.8 s -> 9.8 s on 2 cores), against ~45 s once here.
	($(PY) -m pip install -q uv && $(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) -e '.[dev]') \
	  || $(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m runner

# -n auto: one pytest-xdist worker per CPU (measured on 2 cores: 1.5x; the shared tiny runs are
# trained once per session, not once per worker: tests/conftest.py built_once).
test: $(STAMP) compiler
	$(PY) -m pytest -n auto

# The tests of the compiled oneDNN operators (model.conv=onednn, the default on an AVX2 CPU) build a small C++
# library; without a compiler they skip, and this names what to install (the summary counts them too).
compiler:
	@command -v "$${CXX:-g++}" >/dev/null 2>&1 || { [ -z "$$CXX" ] && command -v c++ >/dev/null 2>&1; } || \
	  echo "note: no C++ compiler ($${CXX:-g++}, c++): the tests of the compiled oneDNN operators will skip." \
	    "Install one (Debian/Ubuntu: apt-get install g++) or set CXX to run them."

# --dist worksteal: the slow tests take 5 s to 3 min each; a worker that has finished its share takes tests
# from the other's, where the default split left one worker running its last long tests alone.
test-slow: $(STAMP) compiler
	$(PY) -m pytest -m slow -n auto --dist worksteal

test-all: $(STAMP) compiler
	$(PY) -m pytest -m '' -n auto

# The compatibility subset (pytest -m compat: compose, train in graph and pynative, AMP O2 with a dynamic
# loss scale, resume, evaluate, MINDIR export, a sweep) on each MindSpore release the package index offers,
# one venv per version under .compat/ (kept: the next call reuses it). Each install downloads ~300 MB.
# Results and times: docs/mindspore-versions.md. One version: make test-compat COMPAT_VERSIONS=2.7.0
COMPAT_VERSIONS ?= 2.7.0 2.8.0 2.9.0 2.10.0
test-compat: $(STAMP)
	@fail=; for v in $(COMPAT_VERSIONS); do \
	  venv=.compat/ms-$$v; \
	  if [ ! -f $$venv/.installed ]; then \
	    $(VENV)/bin/uv venv -q --python $(PY) $$venv && \
	    $(VENV)/bin/uv pip install -q --python $$venv/bin/python -e . "mindspore==$$v" "numpy<2" pytest && \
	    touch $$venv/.installed || exit 1; \
	  fi; \
	  start=$$(date +%s); \
	  $$venv/bin/python -m pytest -p no:xdist -m compat -q tests || fail="$$fail $$v"; \
	  echo "MindSpore $$v: the compatibility subset took $$(( $$(date +%s) - start )) s"; \
	done; \
	if [ -n "$$fail" ]; then echo "failed on MindSpore$$fail"; exit 1; fi

# .pre-commit-config.yaml runs the same three commands.
lint: $(STAMP)
	$(PY) -m ruff format --check . && $(PY) -m ruff check . && $(PY) -m mypy

# The documentation site (mkdocs.yml, docs/): strict, so a broken link, anchor or nav entry fails the build.
# NO_MKDOCS_2_WARNING: Material 9.7+ prints a banner about MkDocs 2 on every build, which is not ours to act on.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve --strict

format: $(STAMP)
	$(PY) -m ruff format . && $(PY) -m ruff check --fix .

clean:
	rm -rf $(VENV) .compat outputs site
