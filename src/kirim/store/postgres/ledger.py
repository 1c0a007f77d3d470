"""A worker that finds the ledger behind what it had committed says so.

kirim's promise holds for what the database keeps. A database that loses commits it
had acknowledged (a failover to an asynchronous standby, ``synchronous_commit =
off`` and a crash) can lose a committed intent: the request left, and the ledger no
longer knows it, so a later claim may send it again. kirim cannot prevent that; it
can notice. The store remembers the intents it committed in the last minutes
(``WATCH_S``); after a lost connection, the next time it reaches the database it
checks that their attempt rows are still there. Missing ones (whose delivery still
is) are logged as one ``ledger_behind`` error and noted in ``kirim_meta``
(``ledger_behind:<host>:<pid>:<n>``), which ``kirim doctor`` reports until an
operator deletes the note.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import socket
import time
from collections.abc import Sequence

from kirim.observe.logging import get_logger
from kirim.store.base import Intent
from kirim.store.postgres.driver import Cursor, rows

#: how long a committed intent is checked for after its commit
WATCH_S = 600.0
#: at most this many recent intents are remembered
WATCH_MAX = 20_000
#: ids named in the log line and the note
LISTED = 10
#: the prefix of the notes in kirim_meta
NOTE = "ledger_behind:"

_notes = itertools.count(1)


class LedgerWatch:
    """The intents this store committed lately, checked after a lost connection."""

    def __init__(self) -> None:
        self._recent: collections.deque[tuple[float, str, int]] = collections.deque(
            maxlen=WATCH_MAX
        )
        #: a connection was lost since the last check
        self.pending = False
        #: every provider request id found missing so far (tools and tests read it)
        self.missing: list[str] = []

    def committed(self, intents: Sequence[Intent], done: Sequence[bool]) -> None:
        now = time.monotonic()
        for intent, ok in zip(intents, done, strict=True):
            if ok:
                self._recent.append((now, intent.provider_request_id, intent.delivery_id))

    def connection_lost(self) -> None:
        self.pending = bool(self._recent)

    async def check(self, cur: Cursor) -> list[str]:
        """Check the recent intents on ``cur``'s connection (autocommit); the provider
        request ids found missing (logged and noted)."""
        self.pending = False
        horizon = time.monotonic() - WATCH_S
        while self._recent and self._recent[0][0] < horizon:
            self._recent.popleft()
        if not self._recent:
            return []
        args = {
            "request_ids": [r for _, r, _ in self._recent],
            "delivery_ids": [d for _, _, d in self._recent],
        }
        found = await rows(cur, "intents_missing", args)
        if not found:
            return []
        gone = {str(r["request_id"]) for r in found}
        self._recent = collections.deque(
            (e for e in self._recent if e[1] not in gone), maxlen=WATCH_MAX
        )
        request_ids = sorted(gone)
        delivery_ids = sorted({int(r["delivery_id"]) for r in found})
        self.missing += request_ids
        note = {
            "noticed_at": time.time(),
            "missing": len(request_ids),
            "provider_request_ids": request_ids[:LISTED],
            "delivery_ids": delivery_ids[:LISTED],
        }
        key = f"{NOTE}{socket.gethostname()}:{os.getpid()}:{next(_notes)}"
        await rows(cur, "note_ledger_behind", {"key": key, "value": json.dumps(note)})
        get_logger().error(
            "ledger_behind",
            missing=len(request_ids),
            provider_request_ids=",".join(request_ids[:LISTED]),
            notification_ids=",".join(str(d) for d in delivery_ids[:LISTED]),
            reason="the database lost intents this worker had committed (a failover to an "
            "asynchronous standby, or synchronous_commit = off and a crash): their requests "
            "may have reached the provider and may be sent again; see `kirim doctor`",
        )
        return request_ids
