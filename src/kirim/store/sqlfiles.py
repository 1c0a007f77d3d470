"""Named queries and numbered migrations kept in ``.sql`` files beside the code."""

from __future__ import annotations

import re
from importlib import resources
from importlib.resources.abc import Traversable

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def _folder(dialect: str) -> Traversable:
    """``store/<dialect>/sql/``: the dialect's queries and migrations."""
    return resources.files(f"kirim.store.{dialect}").joinpath("sql")


def load_queries(dialect: str) -> dict[str, str]:
    """Parse every ``store/<dialect>/sql/*.sql`` that is not a migration (``queries.sql``
    and the files named for what they hold): each query starts with ``-- name: x``."""
    queries: dict[str, str] = {}
    files = sorted(_folder(dialect).iterdir(), key=lambda e: e.name)
    for entry in files:
        if not entry.name.endswith(".sql") or re.match(r"\d{4}_", entry.name):
            continue
        parts = _NAME.split(entry.read_text())
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in queries:
                raise ValueError(f"query {name!r} is defined twice in {dialect}'s sql/")
            lines = [line for line in body.splitlines() if not line.startswith("--")]
            queries[name] = "\n".join(lines).strip().rstrip(";")
    return queries


def migrations(dialect: str) -> list[tuple[int, str]]:
    """``(version, sql)`` of every ``NNNN_name.sql`` migration, in order."""
    return [(version, sql) for version, _, sql in migration_files(dialect)]


def migration_files(dialect: str) -> list[tuple[int, str, str]]:
    """``(version, name, sql)`` of every ``NNNN_name.sql`` migration, in order (``name``
    without ``.sql``)."""
    found = []
    for entry in _folder(dialect).iterdir():
        match = re.fullmatch(r"((\d{4})_\w+)\.sql", entry.name)
        if match:
            found.append((int(match.group(2)), match.group(1), entry.read_text()))
    return sorted(found)
