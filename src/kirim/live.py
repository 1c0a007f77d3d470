"""Live updates of recipients' feeds: what a stream (``GET .../feed/stream``) waits on
and reads.

A stream holds a number: that of the last feed write it told of (every write to a
feed row numbers it, in its own transaction: ``kirim.store.feed_changes``). It sleeps
until its recipient's feed may have changed, then reads what was written after its
number, from the store. A wake-up is only a hint, so a lost or doubled one costs a
read, never a change: what a stream sends always comes from the store.

The wake-ups of one process, a ``FeedHub``:

- every change made in this process (``Kirim.on_feed_change``: the feed verbs, the
  workers of ``Kirim.worker()``);
- on PostgreSQL, ``LISTEN kirim_feed`` on one connection: each feed write says
  ``pg_notify('kirim_feed', recipient_id)`` in its transaction, so the changes made by
  other processes (workers, other ``kirim serve``) arrive when they commit; a lost
  connection wakes every stream (a notification may have been missed);
- on SQLite, which has no notifications, a look at the feed's counter once a
  ``poll`` (a second): when another process (a worker) has written, every stream of
  this process reads.

Streams of one recipient woken together that hold the same number share one read.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol, cast

if TYPE_CHECKING:
    from kirim.engine import Kirim
    from kirim.store.feed_changes import FeedChanges

#: the most feed rows one read gives a stream (it reads again at once for more)
READ_LIMIT = 200
#: SQLite: seconds between looks at the feed's counter (other processes' writes)
POLL = 1.0
#: seconds before a lost LISTEN connection is opened again
RECONNECT = 1.0


class ListensAt(Protocol):
    """A store that ``listens`` (its declared capability): where its LISTEN goes."""

    @property
    def listen_conninfo(self) -> str: ...


class FeedHub:
    """The wake-ups and reads of one process's streams (see the module's text)."""

    def __init__(self, kirim: Kirim, *, poll: float = POLL) -> None:
        self.kirim = kirim
        self.poll = poll
        #: set when the server stops: every stream ends
        self.stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: dict[str, set[asyncio.Event]] = {}
        self._generation: dict[str, int] = {}
        self._reads: dict[tuple[str, int], tuple[int, asyncio.Future[FeedChanges]]] = {}
        self._task: asyncio.Task[None] | None = None
        kirim.on_feed_change.append(self._changed)

    # -- wake-ups -------------------------------------------------------------------

    def _changed(self, recipient_id: str, kind: str, item_id: int) -> None:
        self.wake(recipient_id)

    def wake(self, recipient_id: str | None) -> None:
        """Wake the streams of ``recipient_id`` (None: every stream); from any thread."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._wake(recipient_id)
        else:
            loop.call_soon_threadsafe(self._wake, recipient_id)

    def _wake(self, recipient_id: str | None) -> None:
        chosen = list(self._waiting) if recipient_id is None else [recipient_id]
        for rid in chosen:
            self._generation[rid] = self._generation.get(rid, 0) + 1
            for event in self._waiting.get(rid, ()):
                event.set()

    @property
    def streams(self) -> int:
        """How many streams are open in this process."""
        return sum(len(s) for s in self._waiting.values())

    @contextlib.asynccontextmanager
    async def subscribe(self, recipient_id: str) -> AsyncIterator[asyncio.Event]:
        """An event set whenever ``recipient_id``'s feed may have changed (clear it
        before each read), for as long as the block runs."""
        self._loop = asyncio.get_running_loop()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._watch(), name="kirim-feed-wakeups")
        event = asyncio.Event()
        self._waiting.setdefault(recipient_id, set()).add(event)
        try:
            yield event
        finally:
            waiting = self._waiting.get(recipient_id)
            if waiting is not None:
                waiting.discard(event)
                if not waiting:
                    del self._waiting[recipient_id]
                    self._generation.pop(recipient_id, None)

    def stop(self) -> None:
        """End every stream (the server stops); from any thread."""
        self.stopping = True
        self.wake(None)

    async def close(self) -> None:
        """Stop the streams and the wake-up task."""
        self.stopping = True
        self._wake(None)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _watch(self) -> None:
        """Wake streams for the changes of other processes, while the hub lives."""
        store = self.kirim.store
        if store.listens:  # LISTEN/NOTIFY: PostgreSQL's
            from kirim.store.postgres.feed_listen import listen_for_feeds

            await listen_for_feeds(
                cast(ListensAt, store).listen_conninfo,
                on_notify=self._wake,
                on_lost=lambda: self._wake(None),
                reconnect=RECONNECT,
            )
            return
        last = None
        while True:
            if self._waiting:
                with contextlib.suppress(Exception):  # the database away: streams wait on
                    number = await store.feed_last_number()
                    if number != last:  # the first look too: a write may precede it
                        self._wake(None)
                    last = number
            await asyncio.sleep(self.poll)

    # -- reads ------------------------------------------------------------------------

    async def head(self, recipient_id: str) -> int:
        """The number a new stream starts from: the recipient's last feed write."""
        return await self.kirim.store.feed_head(recipient_id)

    async def last_number(self) -> int:
        """The last number given to any feed write."""
        return await self.kirim.store.feed_last_number()

    async def read(self, recipient_id: str, after: int) -> FeedChanges:
        """What the recipient's feed has after number ``after``. Streams that read the
        same (recipient, number) before a new wake-up share one read."""
        key = (recipient_id, after)
        generation = self._generation.get(recipient_id, 0)
        hit = self._reads.get(key)
        if hit is not None and hit[0] == generation:
            return await asyncio.shield(hit[1])
        future = asyncio.ensure_future(
            self.kirim.store.feed_changes(recipient_id, after, READ_LIMIT)
        )
        self._reads[key] = (generation, future)

        def done(_: asyncio.Future[FeedChanges]) -> None:
            if self._reads.get(key, (0, None))[1] is future:
                del self._reads[key]

        future.add_done_callback(done)
        return await asyncio.shield(future)
