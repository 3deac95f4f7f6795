# raytpu_lab: `make demo` and `make test` set up .venv themselves on a fresh clone (needs only python3).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The [torch] extra (torch + torch_xla, ~7 GB) only for `make test`; `make demo` does not need it.
TORCH_STAMP := $(VENV)/.installed-torch

.PHONY: help install install-torch browser-deps demo test test-all lint clean distclean labextension

help:
	@echo "make demo          run notebooks/01_quickstart.ipynb on the emulated TPU cluster (build/quickstart.html)"
	@echo "make test          the quick set of the unit, notebook, browser and integration tests (<= 15 min)"
	@echo "make test-all      every test, the slow scenarios too (about an hour on 2 cores; what CI runs)"
	@echo "make install       create $(VENV) and pip install -e '.[dev]' (redone when pyproject.toml changes)"
	@echo "make install-torch also the [torch] extra (torch + torch_xla, ~7 GB); make test does it"
	@echo "make browser-deps  Debian chromium for the browser tests (apt-get, as root)"
	@echo "make labextension  rebuild the Ray TPU sidebar (extensions/raytpu-sidebar -> raytpu_lab/jupyter/labextension; needs node)"
	@echo "make lint          ruff + mypy on raytpu_lab (strict on the typed core, pyproject.toml [[tool.mypy.overrides]])"
	@echo "make clean         remove build/, caches and emulated clusters; distclean also removes $(VENV)"

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $@

install-torch: $(TORCH_STAMP)

# Both extras in one pip run (a fresh clone's `make test`): installing [dev] first and then
# [dev,torch] resolves every requirement and builds the editable package twice. It also counts
# as `make install` (the [dev] stamp is touched too).
$(TORCH_STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,torch]'
	@touch $@ $(STAMP)

# The browser tests drive Debian's chromium (/usr/bin/chromium) with Playwright;
# `playwright install` would download a browser, which this setup never does.
browser-deps:
	@if [ -x /usr/bin/chromium ]; then \
		echo "chromium: $$(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"; \
	elif [ "$$(id -u)" = 0 ]; then \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; \
	else \
		echo "browser-deps: /usr/bin/chromium is missing and installing it needs root." >&2; \
		echo "  run:  sudo apt-get update && sudo apt-get install -y chromium" >&2; \
		exit 1; \
	fi

# `make demo TIMEOUT=600`: seconds the emulated cluster may take to start (default 180).
demo: $(STAMP)
	$(PY) -m tools.demo $(if $(TIMEOUT),--timeout $(TIMEOUT))

# Two sets of the same four tiers (unit, notebooks, browser, integration), in one pytest session each:
# `make test`      the quick set (-m "not slow"): every tier, a few busy-machine tests among them;
#                  at most 15 min from a fresh clone on a 2-core machine, install included.
# `make test-all`  every test, the `slow` scenarios too (busy-machine variants, host faults,
#                  tests that start clusters of their own): about an hour here; what CI runs.
# TEST_BUDGET / TEST_ALL_BUDGET: minutes after which pytest stops after the test it is running
# (tests/conftest.py reads RAYTPU_TEST_BUDGET_S; the run then fails and still prints which tests
# ran, failed or were left), well inside CI's own limit (90 min with the install);
# `timeout` is the backstop for a hung test (SIGINT alone is not enough: Ray and Jupyter
# swallow it). --tb=native: pytest's own traceback formatting trips CPython
# 3.11.7's AST recursion bug (pytest-dev/pytest#11724) and ends the session before its summary.
# --reruns 1 (pytest-rerunfailures): a failed test runs once more; a test of real Ray processes
# on a loaded 2-core machine can miss a deadline once, a bug fails twice; reruns are listed (R).
TEST_BUDGET ?= 25
TEST_ALL_BUDGET ?= 78
TIERS := tests/unit tests/notebooks tests/browser tests/integration
define run_pytest
	@start=$$(date +%s); \
	RAYTPU_TEST_BUDGET_S=$$(( $(2) * 60 )) \
	timeout --signal=INT --kill-after=120 $$(( $(2) + 6 ))m \
	$(PY) -m pytest $(TIERS) $(1) -q -rfER --tb=native \
	  -p no:cacheprovider --timeout=600 --reruns 1 --reruns-delay 2 --durations=30 -W ignore::DeprecationWarning; rc=$$?; \
	echo "make $@: wall $$(( $$(date +%s) - start )) s (exit $$rc)"; exit $$rc
endef

test: $(TORCH_STAMP) browser-deps lint
	$(call run_pytest,-m "not slow",$(TEST_BUDGET))

test-all: $(TORCH_STAMP) browser-deps lint
	$(call run_pytest,,$(TEST_ALL_BUDGET))

# The sidebar's built output is committed (installs need no node); rebuild it after changing
# extensions/raytpu-sidebar or raytpu_lab/widgets/topology_map.js (the map's drawing code, which
# the sidebar bundles), then commit raytpu_lab/jupyter/labextension.
LABEXT_SRC := extensions/raytpu-sidebar
labextension: $(STAMP)
	cd $(LABEXT_SRC) && PATH=$(CURDIR)/$(VENV)/bin:$$PATH jlpm install && PATH=$(CURDIR)/$(VENV)/bin:$$PATH jlpm clean && PATH=$(CURDIR)/$(VENV)/bin:$$PATH jlpm build

# mypy reads pyproject.toml: the whole package, and --strict's checks on the modules listed in
# [[tool.mypy.overrides]] (state/, tpu/, the views, ...); extend that list, not this target.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy raytpu_lab

# Stops every emulated cluster under the emulator's state root ($$RAYTPU_EMULATOR_ROOT or
# /tmp/raytpu) and removes stale state left by crashed runs.
clean:
	rm -rf build .ruff_cache .mypy_cache .pytest_cache
	@if [ -x $(PY) ]; then $(PY) -c 'from raytpu_lab.cluster import emulator as e; \
		root = e.state_root(); \
		names = [d.name for d in root.iterdir() if d.is_dir()] if root.is_dir() else []; \
		found = [c for c in map(e.find, names) if c is not None]; \
		[c.down() for c in found]; \
		print(f"clean: stopped {len(found)} emulated cluster(s) under {root}")'; fi
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
