"""The worker's run advancer (``kirim.worker.flows``) on both backends: a tick that
claims a full batch lets the next turn claim again at once (a backlog of runs is not
paced by the poll interval); a batch is advanced in one transaction, and a run whose
advance fails for a reason of its own stops neither the batch's others nor the worker.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim
from kirim.keys import canonical_json
from kirim.notify.types import parse_type
from kirim.providers.inbox import InboxProvider
from kirim.runs import RunStatus
from kirim.store.flows import NewRun
from kirim.testing import ManualClock
from kirim.worker import WorkerSettings
from kirim.worker.flows import BATCH

FLOW = parse_type(
    "flow",
    {
        "templates": {"inbox": {"title": "t {{ n }}"}},
        "steps": [{"send": "inbox"}, {"delay": "1h"}, {"send": "inbox", "name": "again"}],
    },
)
#: no poll interval passes in these tests
SETTINGS = WorkerSettings(lease=30.0, poll_interval=3600.0)


@pytest.fixture
async def app(database_url: str, clock: ManualClock) -> AsyncIterator[Kirim]:
    channels = {"inbox": Channel(name="inbox", provider=InboxProvider())}
    kirim = Kirim(Config(database=database_url), channels=channels, clock=clock, types=[FLOW])
    await kirim.open(migrate=True)
    yield kirim
    await kirim.close()


async def _start(app: Kirim, n: int) -> None:
    recipients = [f"u{i}" for i in range(n)]
    await app.notify_event("flow", recipients, {"n": 1}, event_id="e1")


async def test_a_full_batch_lets_the_next_turn_claim_at_once(app: Kirim) -> None:
    """BATCH x 2 + 7 runs due: three turns claim them all, the poll interval unpassed;
    the fourth waits for it."""
    await _start(app, BATCH * 2 + 7)
    advancer = app.worker(settings=SETTINGS)._runs
    assert [await advancer.tick() for _ in range(4)] == [BATCH, BATCH, 7, 0]
    assert (await app.store.run_counts()) == {"waiting": BATCH * 2 + 7}
    assert (await app.store.counts())["deliveries"] == {"pending": BATCH * 2 + 7}


async def test_one_broken_run_stops_neither_the_others_nor_the_worker(
    app: Kirim, clock: ManualClock
) -> None:
    """A run whose message is missing rolls its batch back; the advancer then takes
    each run alone: the others advance, the broken one is left to its lease."""
    await _start(app, 3)
    broken = NewRun(
        key="broken",
        type="flow",
        event_id="e2",
        recipient_id="u9",
        steps_json=canonical_json([st.to_json() for st in FLOW.steps]),
        data_json="{}",
        messages={},  # its send step's message is not there
        max_attempts=3,
    )
    (started,) = await app.store.start_runs([broken], now=clock.now())
    advancer = app.worker(settings=SETTINGS)._runs
    assert await advancer.tick() == 4
    runs = await app.store.list_runs()
    waiting_at = {r.id: (r.status, r.cursor) for r in runs}
    assert waiting_at.pop(started.run.id) == (RunStatus.WAITING, 0)
    assert set(waiting_at.values()) == {(RunStatus.WAITING, 2)}
    assert (await app.store.counts())["deliveries"] == {"pending": 3}
