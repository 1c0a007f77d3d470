"""bench/statement_costs.py: the server's time and WAL by statement, on a private server.

A real run on a few hundred notifications (a private PostgreSQL server with
``pg_stat_statements``, ``tests/pgserver.py``); no timing is asserted, only that the
drain delivered everything and that its batch statements were found by their kirim
names with the WAL they wrote (a name that no longer matches would show as raw text).
"""

from __future__ import annotations

import pytest

from bench_scripts import load
from pgserver import require


@pytest.mark.slow
def test_statement_costs_names_the_drains_statements(request: pytest.FixtureRequest) -> None:
    require(request)
    result = load("statement_costs").measure(300)
    assert result["sent"] == 300
    by_name = {s["statement"]: s for s in result["statements"]}
    for name in ("claim_fresh", "insert_intents", "finish_fenced"):
        assert by_name[name]["calls"] >= 1, name
        assert by_name[name]["wal_bytes"] > 0, name
    assert result["wal_bytes_per_delivery"] > 0


def test_shape_matches_the_servers_normalized_text() -> None:
    """kirim's text and the server's record of it (constants and placeholders as $n)."""
    shape = load("statement_costs").shape
    ours = "SELECT a FROM t -- it's why\nWHERE x = %(x)s AND y = 'q' AND z IS true LIMIT 1"
    theirs = "SELECT a FROM t -- it's why\nWHERE x = $1 AND y = $2 AND z IS $3 LIMIT $4"
    assert shape(ours) == shape(theirs)
    assert shape("SELECT a FROM t") != shape("SELECT b FROM t")
