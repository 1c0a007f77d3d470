"""Keys sent by another system, imported as tombstones (``kirim import-keys``).

When kirim takes over the sends of an existing system (a Celery task with a unique
constraint, an outbox table; docs/adopting.md), the keys that system has already
sent must not be sent again by kirim. Each imported key becomes a tombstone, the
same row a pruned delivery leaves (``kirim.store.retention``): a ``notify()`` with
that key then creates nothing and answers ``pruned`` (``EnqueueResult.pruned``),
on SQLite and PostgreSQL alike. An imported tombstone names no delivery of kirim's:
its delivery id is 0 (``IMPORTED``), its status ``sent``, and its time the import's,
so it expires like any other, ``[retention] keys`` after it was written.

A key kirim already holds, as a delivery or as a tombstone, is left as it is (counted
``known``): importing the same file twice writes nothing the second time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from kirim.store.retention import key_hash
from kirim.store.sequence import TIME, Operation, Query

#: the delivery id of an imported key's tombstone: no delivery of kirim's had the key
IMPORTED = 0
#: keys per transaction
BATCH = 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class ImportResult:
    """What one import did (or, with ``dry_run``, would do)."""

    #: tombstones written (or that would be)
    imported: int = 0
    #: keys kirim already held, as a delivery or a tombstone: left as they were
    known: int = 0
    dry_run: bool = False

    def __add__(self, other: ImportResult) -> ImportResult:
        return ImportResult(
            imported=self.imported + other.imported,
            known=self.known + other.known,
            dry_run=self.dry_run or other.dry_run,
        )

    def as_dict(self) -> dict[str, object]:
        return {"dry_run": self.dry_run, "imported": self.imported, "known": self.known}


def import_keys(
    keys: Sequence[str], given: float, dry_run: bool = False
) -> Operation[ImportResult]:
    """Write a tombstone for each of ``keys`` (distinct) that kirim holds neither as a
    delivery nor as a tombstone, at the store's time of record for ``given``.
    ``dry_run``: count them, write nothing."""
    if not keys:
        return ImportResult(dry_run=dry_run)
    at = yield TIME
    now = at(given)
    items = [{"key": k, "key_hash": key_hash(k)} for k in keys]
    if dry_run:
        (found,) = yield Query("import_count_known", {"items": items})
        known = int(found["n"])
        return ImportResult(imported=len(keys) - known, known=known, dry_run=True)
    written = yield Query("import_key_tombstones", {"items": items, "now": now}, count=True)
    return ImportResult(imported=int(written), known=len(keys) - int(written))


@runtime_checkable
class ImportsKeys(Protocol):
    """A store that imports keys as tombstones (both backends)."""

    async def import_keys(
        self, keys: Sequence[str], *, now: float, dry_run: bool = False
    ) -> ImportResult:
        """One batch (one transaction): see ``kirim.store.imports.import_keys``."""
        ...


__all__ = ["BATCH", "IMPORTED", "ImportResult", "ImportsKeys", "import_keys"]
