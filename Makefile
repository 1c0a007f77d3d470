# kirim — the two commands of the quick start are `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean venv loop-versions explore
# The explorer's deterministic loop relies on asyncio internals: its tests also run on
# these Pythons (pyenv's, else pythonX.Y on PATH; a version not found is said and skipped).
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
	@# Chromium for the browser tests; without root (or a network) they skip with one line
	@# saying why, and fail under CI.
	test -x /usr/bin/chromium || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium) \
	  || echo "make test: chromium could not be installed here: the browser tests will skip"
	command -v promtool >/dev/null || (apt-get update && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y --no-install-recommends prometheus) \
	  || echo "make test: promtool could not be installed here: its check of the alert rules will skip"
	$(BIN)/python tests/pg.py ensure
	$(BIN)/python -m pytest

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
	    tests/explore/test_schedules.py::test_same_seed_same_trace_hash || exit 1; \
	done

# The long soak: every scheduling policy over many seeds (SQLite), then the PostgreSQL
# lane on a smaller budget, then the notification layer's workload (events).
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

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,postgres,bench]'
	$(BIN)/python tests/pg.py ensure
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) .venv-3.* .pytest_cache .mypy_cache .ruff_cache build *.egg-info src/*.egg-info

# PgBouncer, for the tests that run kirim behind a pooler (tests/pgbouncer.py starts
# instances of its own on free ports); Debian's own service is left disabled, stopped.
.PHONY: pgbouncer chaos
test: pgbouncer
pgbouncer:
	@command -v pgbouncer >/dev/null || test -x /usr/sbin/pgbouncer || \
	  ((apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \
	    --no-install-recommends pgbouncer) || \
	   echo "make: pgbouncer could not be installed here: the pooler tests will skip")
	@(systemctl disable --now pgbouncer || service pgbouncer stop) >/dev/null 2>&1 || true

# The long failover and pooler runs (make test runs a short one of each): ten seeded
# runs per replication mode and through PgBouncer; the figures of docs/operations.md.
chaos: $(STAMP) pgbouncer
	$(BIN)/python tests/pg.py ensure
	KIRIM_CHAOS_RUNS=10 $(BIN)/python -m pytest -q -s -p no:cacheprovider \
	  tests/acceptance/test_failover_chaos.py tests/acceptance/test_pooler_chaos.py \
	  tests/acceptance/test_failover_points.py tests/acceptance/test_sqlite_power_loss.py
