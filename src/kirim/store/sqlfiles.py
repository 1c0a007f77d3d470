"""Named queries and numbered migrations kept in ``.sql`` files beside the code."""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def load_queries(dialect: str) -> dict[str, str]:
    """Parse ``sql/<dialect>/queries.sql``: each query starts with ``-- name: x``."""
    text = resources.files("kirim.store").joinpath("sql", dialect, "queries.sql").read_text()
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [line for line in body.splitlines() if not line.startswith("--")]
        queries[name] = "\n".join(lines).strip().rstrip(";")
    return queries


def migrations(dialect: str) -> list[tuple[int, str]]:
    """``(version, sql)`` of every ``NNNN_name.sql`` migration, in order."""
    folder = resources.files("kirim.store").joinpath("sql", dialect)
    found = []
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d{4})_\w+\.sql", entry.name)
        if match:
            found.append((int(match.group(1)), entry.read_text()))
    return sorted(found)
