"""The batch columns' list dumper: psycopg's bytes, packed a list at a time."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.adapt import PyFormat, Transformer
from psycopg.types.array import ListBinaryDumper

from kirim.store.postgres.arrays import FlatListBinaryDumper

LISTS: list[list[Any]] = [
    [1, 2, 3],
    [0, -(2**15)],
    [1, 2**31, -5],
    [2**62, -(2**63)],
    [2**70],  # numeric: psycopg's own path
    [0.5, -1e300, float("inf")],
    [True, False, True],
    ["a", "", 'quo"te', "back\\slash", "{NULL}", "NULL", "é ✓ 日本", " spaced "],
    ["x" * 5000],
    [None],
    [None, None, None],
    [],
    [1, None, 3],
    ["a", None],
    [[1, 2], [3, 4]],
]


def _dumped(dumper_class: type, value: list[Any]) -> tuple[int, int, bytes]:
    tx = Transformer()
    tx.adapters.register_dumper(list, dumper_class)
    dumper = tx.get_dumper(value, PyFormat.BINARY)
    data = dumper.dump(value)
    return dumper.oid, dumper.format, b"" if data is None else bytes(data)


@pytest.mark.parametrize("value", LISTS, ids=repr)
def test_the_bytes_are_psycopgs(value: list[Any]) -> None:
    """Every list is dumped with the type, the format and the bytes of psycopg's
    own binary list dumper."""
    assert _dumped(FlatListBinaryDumper, value) == _dumped(ListBinaryDumper, value)


@pytest.mark.parametrize("backend", ["postgres"])
def test_the_server_reads_back_what_was_sent(request: pytest.FixtureRequest, backend: str) -> None:
    """Columns sent with the dumper come back from PostgreSQL as they were, through
    the casts kirim's queries use."""
    from kirim.store.postgres import postgres_conninfo
    from pg import fresh_database

    url = fresh_database(request)
    casts = {
        "bigint": [[1, 2**40, -3], [None, None]],
        "int": [[200, -7]],
        "float8": [[0.25, 1e-9, -2.5], [None]],
        "boolean": [[True, False]],
        "text": [["a", "", 'quo"te', "é ✓", "NULL", "{,}"], [None, None], []],
    }
    with psycopg.connect(postgres_conninfo(url)[0], autocommit=True) as conn:
        conn.adapters.register_dumper(list, FlatListBinaryDumper)
        for cast, values in casts.items():
            for value in values:
                row = conn.execute(f"SELECT %s::{cast}[]", (value,)).fetchone()
                assert row is not None
                assert row[0] == value, (cast, value)
