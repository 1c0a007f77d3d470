"""The worker's run advancer (``kirim.worker.flows``) on both backends: a tick that
claims a full batch lets the next turn claim again at once (a backlog of runs is not
paced by the poll interval); a batch is advanced in one transaction, and a run whose
advance fails for a reason of its own stops neither the batch's others nor the worker.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from kirim.channels import Channel
from kirim.cli import main
from kirim.config import Config
from kirim.engine import Kirim
from kirim.keys import canonical_json
from kirim.notify.types import parse_type
from kirim.providers.inbox import InboxProvider
from kirim.runs import RunStatus, run_json
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


async def _set_steps(url: str, run_id: int, steps: str) -> None:
    if url.startswith("sqlite"):
        with sqlite3.connect(url.split("///", 1)[1]) as conn:
            conn.execute("UPDATE kirim_runs SET steps = ? WHERE id = ?", (steps, run_id))
        return
    async with await psycopg.AsyncConnection.connect(url) as conn:
        await conn.execute("UPDATE kirim_runs SET steps = %s WHERE id = %s", (steps, run_id))


async def _row(url: str, run_id: int) -> tuple[str, str | None]:
    query = "SELECT why, claimed_by FROM kirim_runs WHERE id = {}"
    if url.startswith("sqlite"):
        with sqlite3.connect(url.split("///", 1)[1]) as conn:
            return conn.execute(query.format("?"), (run_id,)).fetchone()
    async with await psycopg.AsyncConnection.connect(url) as conn:
        found = await (await conn.execute(query.format("%s"), (run_id,))).fetchone()
        assert found is not None
        return found[0], found[1]


async def test_a_run_this_kirim_cannot_read_is_left_for_a_newer_one(
    app: Kirim, clock: ManualClock, database_url: str
) -> None:
    """A run a newer kirim recorded, with a step of a kind this one does not know (a
    rolling upgrade): the claim sets it aside (its claim released, looked at again
    later, why said) instead of failing every claim, and the readable runs advance."""
    await _start(app, 2)
    future = await app.notify_event("flow", ["u9"], {"n": 1}, event_id="e2")
    steps = canonical_json([{"kind": "webhook_wait", "name": "d", "url": "http://127.0.0.1:9/"}])
    await _set_steps(database_url, future.runs[0].run_id, steps)  # as a newer kirim wrote
    advancer = app.worker(settings=SETTINGS)._runs
    assert await advancer.tick() == 2
    assert (await app.store.counts())["deliveries"] == {"pending": 2}
    why, claimed_by = await _row(database_url, future.runs[0].run_id)
    assert "cannot read" in why
    assert "left for a newer kirim" in why
    assert claimed_by is None
    claims = await app.store.claim_runs(worker_id="w2", now=clock.now(), lease=30, limit=10)
    assert claims == []  # set aside: not due again yet, not claimed by anyone
    clock.advance(3601)  # the readable runs' delay is over; the unreadable is due again
    assert await advancer.tick(force=True) == 2
    assert (await app.store.counts())["deliveries"] == {"pending": 4}


async def test_an_operator_reads_and_cancels_a_run_this_kirim_cannot_read(
    app: Kirim, database_url: str
) -> None:
    """The operator's reads of a newer kirim's run (``get_run``, ``list_runs``, what
    ``kirim run show|list`` and the dashboard print) answer it with its steps as
    stored and why this kirim cannot read them, instead of raising; and ``kirim run
    cancel`` cancels it (a cancellation needs no step)."""
    future = await app.notify_event("flow", ["u9"], {"n": 1}, event_id="e2")
    run_id = future.runs[0].run_id
    steps = canonical_json([{"kind": "webhook_wait", "name": "d", "url": "http://127.0.0.1:9/"}])
    await _set_steps(database_url, run_id, steps)
    found = await app.must_get_run(run_id)
    assert found.unreadable is not None
    assert "cannot read" in found.unreadable
    shown = run_json(found)
    assert shown["unreadable"] == found.unreadable
    assert [(s["kind"], s["state"]) for s in shown["steps"]] == [("webhook_wait", "unreadable")]
    assert [r.id for r in await app.store.list_runs()] == [run_id]
    done = await app.cancel_run(run_id)
    assert done.changed
    assert done.run.status is RunStatus.CANCELED


def test_the_cli_shows_a_run_this_kirim_cannot_read(tmp_path: Path) -> None:
    """``kirim run show`` and ``kirim run list`` print a newer kirim's run (exit 0),
    its stored steps and why this kirim cannot read them."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"

    async def setup() -> int:
        channels = {"inbox": Channel(name="inbox", provider=InboxProvider())}
        kirim = Kirim(Config(database=url), channels=channels, clock=ManualClock(), types=[FLOW])
        await kirim.open(migrate=True)
        try:
            done = await kirim.notify_event("flow", ["u9"], {"n": 1}, event_id="e2")
        finally:
            await kirim.close()
        steps = canonical_json(
            [{"kind": "webhook_wait", "name": "d", "url": "http://127.0.0.1:9/"}]
        )
        await _set_steps(url, done.runs[0].run_id, steps)
        return done.runs[0].run_id

    run_id = asyncio.run(setup())
    runner = CliRunner()
    shown = runner.invoke(main, ["--database", url, "run", "show", str(run_id)])
    assert shown.exit_code == 0, shown.output
    assert "its steps are a newer kirim's" in shown.output
    assert " 0 webhook_wait" in shown.output
    listed = runner.invoke(main, ["--database", url, "run", "list"])
    assert listed.exit_code == 0, listed.output
