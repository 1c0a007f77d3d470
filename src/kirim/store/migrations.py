"""The numbered migrations as an operator reads them: what each does and whether
workers of the older kirim may keep running while it is applied.

Each ``store/<dialect>/sql/NNNN_name.sql`` says so in one header line, read here::

    -- upgrade: safe: <why older workers may run on while it is applied>
    -- upgrade: stop: <why they must be stopped first>

(continued on ``--   `` lines). ``kirim migrate --check`` and ``--dry-run`` print
the plan built from them; docs/upgrading.md explains the procedure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from kirim.store.base import SCHEMA_VERSION
from kirim.store.sqlfiles import migration_files

_HEADER = re.compile(r"^-- upgrade: (safe|stop): (.*(?:\n--   .*)*)", re.MULTILINE)


class OlderWorkers(StrEnum):
    """Whether workers of the older kirim may run on while a migration is applied."""

    SAFE = "safe"
    STOP = "stop"


@dataclass(frozen=True, slots=True, kw_only=True)
class Migration:
    """One numbered migration of one dialect."""

    version: int
    #: the file's name without ``.sql``: ``0007_notification_layer``
    name: str
    older_workers: OlderWorkers
    #: why (the header's words)
    why: str
    sql: str

    @property
    def title(self) -> str:
        """The name in words: ``notification layer``."""
        return self.name.split("_", 1)[1].replace("_", " ")


def parse(version: int, name: str, sql: str) -> Migration:
    """The migration of one file; ValueError if its ``-- upgrade:`` line is missing."""
    found = _HEADER.search(sql)
    if found is None:
        raise ValueError(f"migration {name}.sql has no '-- upgrade: safe|stop: why' line")
    why = " ".join(part.strip() for part in found.group(2).split("\n--   "))
    return Migration(
        version=version, name=name, older_workers=OlderWorkers(found.group(1)), why=why, sql=sql
    )


def all_of(dialect: str) -> list[Migration]:
    """Every migration of ``dialect`` (``sqlite``, ``postgres``), in order."""
    return [parse(version, name, sql) for version, name, sql in migration_files(dialect)]


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """What ``kirim migrate`` would do to one database."""

    #: the version the database has (0: no kirim schema)
    current: int
    #: the newest this kirim knows
    target: int
    pending: tuple[Migration, ...]

    @property
    def too_new(self) -> bool:
        """The database was migrated by a newer kirim: this one must not touch it."""
        return self.current > self.target

    @property
    def stop_first(self) -> tuple[Migration, ...]:
        """The pending migrations before which older workers must be stopped (none on a
        database without a schema: no worker can run on it)."""
        if self.current == 0:
            return ()
        return tuple(m for m in self.pending if m.older_workers is OlderWorkers.STOP)

    def as_dict(self) -> dict[str, object]:
        return {
            "current": self.current,
            "target": self.target,
            "too_new": self.too_new,
            "pending": [
                {
                    "version": m.version,
                    "name": m.name,
                    "older_workers": str(m.older_workers),
                    "why": m.why,
                }
                for m in self.pending
            ],
            "stop_workers_first": bool(self.stop_first),
        }


def plan(dialect: str, current: int) -> Plan:
    """The migrations a database at schema ``current`` still needs."""
    pending = tuple(m for m in all_of(dialect) if m.version > current)
    return Plan(current=current, target=SCHEMA_VERSION, pending=pending)


__all__ = ["Migration", "OlderWorkers", "Plan", "all_of", "parse", "plan"]
