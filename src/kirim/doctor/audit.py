"""``kirim doctor``'s checks and the unique-key audit of any delivery table.

A ``Check`` says what was found, in plain words, and the fix. ``audit_unique`` looks
for a unique index (or constraint, or primary key) on exactly the key's columns, and
when there is none, for the duplicates that already got in.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kirim.doctor.probes import Database, Table, UniqueIndex
from kirim.errors import NotFound
from kirim.text import plural as plural  # doctor's counts, re-exported


class CheckStatus(enum.StrEnum):
    """What a check found; its value is the JSON's ``status``."""

    OK = "ok"
    WARNING = "warning"
    PROBLEM = "problem"  # ``kirim doctor`` exits 1
    SKIPPED = "skipped"


#: the statuses by their short names, as the checks write them
OK, WARNING, PROBLEM, SKIPPED = (
    CheckStatus.OK,
    CheckStatus.WARNING,
    CheckStatus.PROBLEM,
    CheckStatus.SKIPPED,
)


@dataclass(frozen=True, slots=True)
class Check:
    """One finding: ``status`` is ok, warning, problem (exit 1) or skipped."""

    name: str
    status: CheckStatus
    message: str
    fix: str | None = None


def report_json(checks: Sequence[Check]) -> dict[str, Any]:
    """``{"ok": no problem, "checks": [{"name", "status", "message", "fix"}, …]}``."""
    return {
        "ok": not any(c.status is PROBLEM for c in checks),
        "checks": [{**asdict(c), "status": c.status.value} for c in checks],
    }


def audit_unique(db: Database, table: Table, columns: Sequence[str], *, name: str) -> list[Check]:
    """A unique index on exactly ``columns``; the duplicates, when there is none."""
    wanted = set(columns)
    cols_sql = ", ".join(_sql_name(db, c) for c in columns)
    base = table.display.split(".")[-1].strip('"')
    index_name = _sql_name(db, f"{base}_{'_'.join(columns)}_key"[:63])
    create = f"CREATE UNIQUE INDEX {index_name} ON {table.display} ({cols_sql})"
    indexes = db.unique_indexes(table)
    exact = [i for i in indexes if set(i.columns) == wanted and len(i.columns) == len(wanted)]
    sound = [i for i in exact if not i.partial and i.valid]
    key = f"{table.display} ({cols_sql})"
    if sound:
        what = "primary key" if sound[0].primary else f"unique index {sound[0].name}"
        checks = [Check(name, OK, f"{key} is unique: {what}")]
        return checks + _nullable(table, columns, name)
    stricter = [
        i for i in indexes if not i.partial and i.valid and i.columns and set(i.columns) < wanted
    ]
    if stricter:
        i = stricter[0]
        message = (
            f"no unique index on exactly {key}, but {i.name} makes "
            f"({', '.join(i.columns)}) unique: no duplicate key can exist, and two different "
            "keys that share those columns cannot both be stored"
        )
        return [Check(name, WARNING, message, f"if that is not intended: {create}")]
    return _not_unique(db, table, columns, exact, name=name, key=key, create=create)


def _not_unique(
    db: Database,
    table: Table,
    columns: Sequence[str],
    exact: Sequence[UniqueIndex],
    *,
    name: str,
    key: str,
    create: str,
) -> list[Check]:
    """Nothing keeps the key unique (``exact``: the partial or invalid indexes on its
    columns): a problem, and the duplicates already stored, if any."""
    notes = []
    for i in exact:
        if i.partial:
            notes.append(f"{i.name} is partial (WHERE …): it guarantees nothing for other rows")
        elif not i.valid:
            notes.append(f"{i.name} is INVALID (a failed CREATE INDEX CONCURRENTLY)")
    total, dups = db.duplicates(table, columns)
    message = f"nothing in the database keeps {key} unique: a retry can insert a second row"
    if notes:
        message += "; " + "; ".join(notes)
    fix = create
    if db.dialect == "postgres":
        fix += " (on a busy table: CREATE UNIQUE INDEX CONCURRENTLY …)"
    if total:
        fix = f"remove the duplicates first (keep one row per key), then {fix}"
    checks = [Check(name, PROBLEM, message, fix)]
    if total:
        shown = "; ".join(
            ", ".join(f"{c}={_short(v)}" for c, v in zip(columns, row[:-1], strict=True))
            + f" ({row[-1]} rows)"
            for row in dups
        )
        checks.append(
            Check(
                "duplicates",
                PROBLEM,
                f"{plural(total, 'key')} already stored more than once: {shown}"
                + (f" (the {len(dups)} most repeated)" if total > len(dups) else ""),
                "decide which row of each key is the real one and delete the others",
            )
        )
    else:
        checks.append(Check("duplicates", OK, f"no duplicate {key} so far"))
    return checks


def _nullable(table: Table, columns: Sequence[str], name: str) -> list[Check]:
    nullable = [c for c in columns if not table.columns.get(c, True)]
    if not nullable:
        return []
    return [
        Check(
            f"{name}_not_null",
            WARNING,
            f"{', '.join(nullable)} may be NULL, and a unique index lets any number of rows "
            "with a NULL key in",
            f"ALTER TABLE {table.display} ALTER COLUMN … SET NOT NULL (or NULLS NOT DISTINCT)",
        )
    ]


#: Words that must be quoted to be used as names (the common ones of both dialects).
_RESERVED = frozenset(
    """all and any array as asc between both case cast check collate column constraint
    create cross current_date current_time current_timestamp current_user default
    deferrable desc distinct do else end except exists false fetch for foreign from full
    grant group having in index initially inner intersect into is join key lateral leading
    left like limit natural not null offset on only or order outer primary references
    returning right select session_user some table then to trailing true union unique user
    using values when where window with""".split()  # noqa: SIM905
)


def _sql_name(db: Database, name: str) -> str:
    """A name as SQL: bare when it is a plain lower-case identifier, else quoted."""
    plain = name.isidentifier() and name.isascii() and name == name.lower()
    return name if plain and name not in _RESERVED else db.quote(name)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "…"


def resolve_columns(table: Table, key: str) -> list[str]:
    """COLS (comma-separated) as the catalog spells them; NotFound for unknown ones."""
    names = [c.strip() for c in key.split(",") if c.strip()]
    if not names:
        raise NotFound("--key needs at least one column name")
    out = []
    for name in names:
        match = name if name in table.columns else None
        if match is None:
            folded = [c for c in table.columns if c.lower() == name.lower()]
            match = folded[0] if len(folded) == 1 else None
        if match is None:
            raise NotFound(
                f"{table.display} has no column {name!r} (columns: {', '.join(table.columns)})"
            )
        if match in out:
            raise NotFound(f"--key names {name!r} twice")
        out.append(match)
    return out


def audit_table(db: Database, table_name: str, key: str) -> list[Check]:
    """``kirim doctor --table T --key COLS``."""
    table = db.table(table_name)
    return audit_unique(db, table, resolve_columns(table, key), name="unique_key")
