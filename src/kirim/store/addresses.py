"""Recipients' addresses in the ledger (``kirim.addresses``), written once for both
backends.

Each function is an ``Operation`` (``kirim.store.sequence``) a backend runs in one
transaction of its own. What an address may be is checked by ``kirim.addresses``
before it is written; here it is only stored, read, retired and removed.
"""

from __future__ import annotations

from collections.abc import Iterable

from kirim.addresses import Address
from kirim.keys import text_problem
from kirim.store.rows import Row
from kirim.store.sequence import TIME, Operation, Query


def address_from(row: Row) -> Address:
    """A row of ``kirim_addresses``."""
    retired = row["retired_at"]
    return Address(
        recipient_id=row["recipient_id"],
        channel=row["channel"],
        address=row["address"],
        label=row["label"],
        added_at=float(row["added_at"]),
        retired_at=None if retired is None else float(retired),
        retired_reason=row["retired_reason"],
    )


def add_address(
    recipient_id: str, channel: str, address: str, label: str | None, given: float
) -> Operation[Address]:
    """Add the address (or register a retired one again); the result as stored."""
    at = yield TIME
    args = {
        "recipient_id": recipient_id,
        "channel": channel,
        "address": address,
        "label": label,
        "now": at(given),
    }
    rows = yield Query("add_address", args)
    return address_from(rows[0])


def addresses_of(recipient_ids: Iterable[str]) -> Operation[dict[str, list[Address]]]:
    """The addresses not retired of those of ``recipient_ids`` that have any, by id,
    oldest first (one statement: the fan-out's read)."""
    ids = sorted(r for r in set(recipient_ids) if text_problem(r) is None)
    if not ids:  # a text no column can hold (a NUL) is nobody's id
        return {}
    rows = yield Query("addresses_of", {"ids": ids})
    out: dict[str, list[Address]] = {}
    for row in rows:
        out.setdefault(row["recipient_id"], []).append(address_from(row))
    return out


def list_addresses(recipient_id: str) -> Operation[list[Address]]:
    """Every address of one recipient, retired ones too."""
    if text_problem(recipient_id) is not None:
        return []
    rows = yield Query("list_addresses", {"recipient_id": recipient_id})
    return [address_from(r) for r in rows]


def retire_address(channel: str, address: str, reason: str, given: float) -> Operation[int]:
    """Mark ``address`` dead on ``channel`` for every recipient that has it; the number
    of rows retired (0: none had it, or it was retired already)."""
    if text_problem(address) is not None:
        return 0
    at = yield TIME
    args = {"channel": channel, "address": address, "reason": reason, "now": at(given)}
    count = yield Query("retire_address", args, count=True)
    return int(count)


def remove_address(recipient_id: str, channel: str, address: str) -> Operation[bool]:
    """Forget one address of one recipient; False when it had none such."""
    if any(text_problem(t) is not None for t in (recipient_id, channel, address)):
        return False
    args = {"recipient_id": recipient_id, "channel": channel, "address": address}
    count = yield Query("remove_address", args, count=True)
    return bool(count)


def retired_addresses() -> Operation[dict[str, int]]:
    """Retired addresses per channel (``kirim status``)."""
    rows = yield Query("retired_addresses")
    return {r["channel"]: int(r["n"]) for r in rows}
