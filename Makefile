# kirim — the two commands of the quick start are `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean venv loop-versions explore chaos dist
# The explorer's deterministic loop relies on asyncio internals, kirim.frozen on
# dataclasses': their tests also run on these Pythons (pyenv's, else pythonX.Y on
# PATH; a version not found is said and skipped).
LOOP_PYTHONS ?= 3.12 3.13

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,postgres]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/kirim demo

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy

test: lint loop-versions
	@# Chromium and PgBouncer (Debian's, without recommends) and promtool (out of Debian's
	@# prometheus package, into the venv): no service started or left enabled
	@# (tests/install_tools.sh)
	sh tests/install_tools.sh $(BIN)
	$(BIN)/python tests/pg.py ensure
	$(BIN)/python -m pytest

# The sdist and the wheel (PyPA's build, isolated), checked as PyPI would read them.
# make test builds them too, in clean venvs, the Dockerfile's way (test_packaging.py).
dist: $(STAMP)
	rm -rf dist
	$(BIN)/python -m build --outdir dist .
	$(BIN)/python -m twine check --strict dist/*

loop-versions:
	@for v in $(LOOP_PYTHONS); do \
	  py=$$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/$$v.*/bin/python3 2>/dev/null | tail -1); \
	  [ -n "$$py" ] || py=$$(command -v python$$v 2>/dev/null); \
	  if [ -z "$$py" ] || ! $$py --version >/dev/null 2>&1; then \
	    echo "loop-versions: no Python $$v here; the loop is pinned on the others"; continue; fi; \
	  env=.venv-$$v; \
	  test -x $$env/bin/python || $$py -m venv $$env; \
	  test -f $$env/.installed -a $$env/.installed -nt pyproject.toml || \
	    ($$env/bin/python -m pip install --quiet -e . pytest pytest-asyncio pytest-timeout \
	     hypothesis && touch $$env/.installed); \
	  echo "loop-versions: Python $$v"; \
	  $$env/bin/python -m pytest -q -p no:cacheprovider tests/explore/test_loop.py \
	    tests/explore/test_schedules.py::test_same_seed_same_trace_hash tests/unit/test_frozen.py \
	    || exit 1; \
	done

# The long soak: every scheduling policy over many seeds (SQLite), then the PostgreSQL
# lane on a smaller budget, then the notification layer's workload (events), then the
# whole configuration (full: 20,000 schedules, and a few on PostgreSQL).
# Failures are shrunk and saved under explore-failures/.
explore: $(STAMP)
	$(BIN)/python tests/pg.py ensure
	$(BIN)/kirim explore --seeds 3000 --policy host --out explore-failures
	$(BIN)/kirim explore --seeds 2000 --policy random --out explore-failures
	$(BIN)/kirim explore --seeds 2000 --policy pct:3 --out explore-failures
	$(BIN)/kirim explore --seeds 60 --database postgresql://postgres@127.0.0.1:5432/test \
	  --out explore-failures
	$(BIN)/kirim explore --seeds 1000 --workload events --out explore-failures
	$(BIN)/kirim explore --seeds 1000 --workload events --policy random --out explore-failures
	$(BIN)/kirim explore --seeds 14000 --workload full --out explore-failures
	$(BIN)/kirim explore --seeds 6000 --start 14000 --workload full --policy random \
	  --out explore-failures
	$(BIN)/kirim explore --seeds 40 --workload full --database \
	  postgresql://postgres@127.0.0.1:5432/test --out explore-failures

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,postgres,bench]'
	$(BIN)/python tests/pg.py ensure
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) .venv-3.* .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info src/*.egg-info

# The long failover and pooler runs (make test runs a short one of each): ten seeded
# runs per replication mode and through PgBouncer; the figures of docs/operations.md.
chaos: $(STAMP)
	sh tests/install_tools.sh $(BIN)
	$(BIN)/python tests/pg.py ensure
	KIRIM_CHAOS_RUNS=10 $(BIN)/python -m pytest -q -s -p no:cacheprovider \
	  tests/acceptance/test_failover_chaos.py tests/acceptance/test_pooler_chaos.py \
	  tests/acceptance/test_failover_points.py tests/acceptance/test_sqlite_power_loss.py
