"""The inbox's readers in a ``full`` schedule: recipients acting on their messages, and
browsers that follow their feed live, with the invariant that judges the streams.

Each ``StreamPlan`` is one browser: it opens a stream (``kirim.http.routes_feed_stream.
events``, over a ``kirim.live.FeedHub`` of the driver's process, on its own host ``R``)
for each of its sessions, from feed number 0 the first time (the whole feed) and then
from the last event id it had, as a browser's ``Last-Event-ID`` does; a session ends
when its time is up (the connection dropped). After the run, one last read from its
last id (the read a stream makes) brings it up to date.

``stream_faithful``: what a browser was told is the feed, nothing missed, nothing
repeated:

- the ids of its change events only grow, across its sessions, and it is told of each
  message's arrival (``message``) at most once;
- at the end, the messages it holds are the store's messages of its recipient that
  are not deleted, with the same seen, read and archived times; one it holds that the
  store has no row of at all was pruned (prune tells no stream; that is allowed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kirim.engine import Kirim
from kirim.errors import NotFound
from kirim.explore.invariants import Ledger, Violation
from kirim.explore.loop import Host, host_context
from kirim.explore.trace import Trace
from kirim.explore.world import FeedAct, StreamPlan, World
from kirim.inbox import iso
from kirim.live import FeedHub

if TYPE_CHECKING:
    from sse_starlette import ServerSentEvent

NAME = "stream_faithful"
MARKS = ("seen_at", "read_at", "archived_at")


@dataclass(slots=True)
class Browser:
    """What one browser was told."""

    recipient: str
    #: the last event id it had (None: none yet)
    last: int | None = None
    #: the ids of its change events, in the order it got them
    ids: list[int] = field(default_factory=list)
    arrivals: Counter[int] = field(default_factory=Counter)
    #: the messages it holds: id -> (seen_at, read_at, archived_at) as the API says them
    held: dict[int, tuple[Any, ...]] = field(default_factory=dict)

    def hear(self, event: ServerSentEvent) -> None:
        """One event of a stream, as the browser reads it off the wire."""
        self.tell(str(event.event), int(str(event.id)), json.loads(str(event.data)))

    def tell(self, kind: str, event_id: int, data: dict[str, Any]) -> None:
        self.last = event_id
        if kind == "counts":
            return
        self.ids.append(event_id)
        if kind == "deleted":
            self.held.pop(int(data["id"]), None)
            return
        if kind == "message":
            self.arrivals[int(data["id"])] += 1
        self.held[int(data["id"])] = tuple(data[m] for m in MARKS)


class Readers:
    """The world's inbox readers and streams, driven on the virtual loop."""

    def __init__(self, world: World, trace: Trace, time: Any) -> None:
        self.world = world
        self.trace = trace
        self.time = time
        self.browsers = [Browser(p.recipient) for p in world.streams]
        self.host = Host("R")
        self._hub: FeedHub | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def started(self) -> bool:
        """Whether the browsers' streams ran (not on PostgreSQL's lane, whose hub would
        LISTEN on a real connection, not on the virtual loop)."""
        return self._hub is not None

    def start(self, app: Kirim) -> None:
        """Open the browsers' streams at their times (none without streams)."""
        if not self.world.streams:
            return
        from kirim.http.routes_feed_stream import events

        hub = self._hub = FeedHub(app)
        loop = asyncio.get_running_loop()

        async def session(recipient: str, after: int, browser: Browser) -> None:
            async for ev in events(hub, recipient, after):
                browser.hear(ev)

        async def follow(plan: StreamPlan, browser: Browser) -> None:
            for opens, closes in plan.sessions:
                await asyncio.sleep(max(0.0, opens - self.time()))
                after = 0 if browser.last is None else browser.last
                self.trace.add(f"stream_open {plan.recipient} after={after}")

                task = loop.create_task(session(plan.recipient, after, browser))
                await asyncio.sleep(max(0.0, closes - self.time()))
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                self.trace.add(f"stream_closed {plan.recipient} last={browser.last}")

        for plan, browser in zip(self.world.streams, self.browsers, strict=True):
            self._tasks.append(
                loop.create_task(follow(plan, browser), context=host_context(self.host))
            )

    async def act(self, app: Kirim, act: FeedAct) -> None:
        """A recipient's action on the message at ``act.pick`` of their feed."""
        if act.verb == "mark_all_read":
            n = await app.mark_feed(act.recipient, "read")
            self.trace.add(f"feed_mark_all_read {act.recipient} changed={n}", host="S")
            return
        page = await app.feed(act.recipient, filter="all", limit=100)
        if not page.items:
            return
        item = page.items[min(len(page.items) - 1, int(act.pick * len(page.items)))]
        try:
            if act.verb == "delete":
                await app.delete_feed_item(act.recipient, item.id)
            else:
                await app.feed_action(act.recipient, item.id, act.verb)
        except NotFound:  # pruned or deleted meanwhile
            pass
        self.trace.add(f"feed_{act.verb} {act.recipient} item={item.id}", host="S")

    async def settle(self) -> None:
        """After the run: the streams closed, and each browser brought up to date by
        the read a stream makes, from its last id."""
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        hub = self._hub
        if hub is None:
            return
        from kirim.http.routes_feed_stream import change_event as sse_event

        for b in self.browsers:
            after = 0 if b.last is None else b.last
            while True:
                batch = await hub.read(b.recipient, after)
                for c in batch.changes:
                    b.hear(sse_event(c))  # the event a stream would have sent
                after = batch.last
                if not batch.more:
                    break
        await hub.close()


def check_streams(readers: Readers | None, ledger: Ledger) -> list[Violation]:
    """``stream_faithful`` (the module's text)."""
    if readers is None or not readers.started:  # no stream ran (PostgreSQL's lane)
        return []
    out = []
    for b in readers.browsers:
        bad = [(x, y) for x, y in zip(b.ids, b.ids[1:], strict=False) if y <= x]
        if bad:
            out.append(_bad(b, f"event id {bad[0][1]} after {bad[0][0]}: told again"))
        twice = sorted(i for i, n in b.arrivals.items() if n > 1)
        if twice:
            out.append(_bad(b, f"told of message {twice[0]} arriving {b.arrivals[twice[0]]} times"))
        rows = {int(r["id"]): r for r in ledger.feed_rows if r["recipient_id"] == b.recipient}
        for i, r in sorted(rows.items()):
            if r["deleted_at"] is not None:
                if i in b.held:
                    out.append(_bad(b, f"still holds message {i}, deleted"))
                continue
            want = tuple(iso(r[m]) for m in MARKS)
            got = b.held.get(i)
            if got is None:
                out.append(_bad(b, f"was never told of message {i}"))
            elif got != want:
                out.append(_bad(b, f"holds message {i} as {got}, the store has {want}"))
    return out


def _bad(b: Browser, what: str) -> Violation:
    return Violation(name=NAME, delivery=None, detail=f"the browser of {b.recipient} {what}")
