"""A delay until a time of the recipient's day, on both backends: its end is computed
once, when the step starts, in the recipient's time zone (else the step's zone, else
UTC), DST-correct, and recorded with the step: the next send goes neither before it
nor much after, and a time zone changed meanwhile does not move it."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest

from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim
from kirim.notify.types import parse_type
from kirim.preferences import Preferences
from kirim.providers.inbox import InboxProvider
from kirim.runs import StepOutcome
from kirim.testing import FlakyProvider, ManualClock
from kirim.worker import WorkerSettings

SETTINGS = WorkerSettings(lease=30.0, backoff_base=1.0, backoff_max=1.0)


def utc(*parts: int) -> float:
    return datetime(*parts, tzinfo=UTC).timestamp()  # type: ignore[misc]


def morning(zone: str | None = None) -> Any:
    delay: dict[str, Any] = {"until": "01:30"}
    if zone is not None:
        delay["zone"] = zone
    return parse_type(
        "morning",
        {
            "templates": {
                "inbox": {"title": "t", "body": "b"},
                "email": {"subject": "s", "body": "b"},
            },
            "steps": [{"send": "inbox"}, {"delay": delay}, {"send": "email"}],
        },
    )


@pytest.fixture
def email() -> FlakyProvider:
    return FlakyProvider()


async def _open(database_url: str, clock: ManualClock, email: FlakyProvider, t: Any) -> Kirim:
    channels = {
        "inbox": Channel(name="inbox", provider=InboxProvider()),
        "email": Channel(name="email", provider=email),
    }
    app = Kirim(Config(database=database_url), channels=channels, clock=clock, types=[t])
    await app.open(migrate=True)
    return app


@pytest.fixture
async def app(database_url: str, clock: ManualClock, email: FlakyProvider) -> AsyncIterator[Kirim]:
    kirim = await _open(database_url, clock, email, morning("Europe/Berlin"))
    yield kirim
    await kirim.close()


async def drain(app: Kirim) -> None:
    worker = app.worker(settings=SETTINGS)
    while await worker.run_once():
        pass


async def _start(app: Kirim, recipient: str = "u1") -> int:
    result = await app.notify_event("morning", [recipient], {}, event_id="e1")
    return result.runs[0].run_id


async def test_the_recipients_zone_on_the_night_the_clocks_fall_back(
    app: Kirim, clock: ManualClock, email: FlakyProvider
) -> None:
    """New York, 2026-11-01: 01:30 happens twice; the run waits for the first (05:30
    UTC), sends nothing before it and the email at it."""
    await app.set_preferences(Preferences(recipient_id="u1", timezone="America/New_York"))
    clock.set(utc(2026, 10, 31, 22))
    run_id = await _start(app)
    await drain(app)
    run = await app.must_get_run(run_id)
    due = utc(2026, 11, 1, 5, 30)
    assert run.next_at == due
    assert run.recorded[1].outcome is StepOutcome.WAITED
    assert run.recorded[1].until == due
    assert run.recorded[1].why == "until 01:30 in America/New_York"
    clock.set(due - 1)
    await drain(app)
    assert email.requests == []
    clock.set(due)
    await drain(app)
    assert len(email.requests) == 1


async def test_a_recipient_without_a_zone_reads_the_steps(app: Kirim, clock: ManualClock) -> None:
    """No preferences: the step's zone (Berlin: 01:30 CET is 00:30 UTC)."""
    clock.set(utc(2026, 12, 2, 12))
    run_id = await _start(app)
    await drain(app)
    run = await app.must_get_run(run_id)
    assert run.next_at == utc(2026, 12, 3, 0, 30)
    assert run.recorded[1].why == "until 01:30 in Europe/Berlin"


async def test_without_either_zone_it_is_utc(
    database_url: str, clock: ManualClock, email: FlakyProvider
) -> None:
    """Neither the recipient nor the step names a zone: UTC."""
    app = await _open(database_url, clock, email, morning())
    try:
        clock.set(utc(2026, 12, 2, 12))
        run_id = await _start(app)
        await drain(app)
        assert (await app.must_get_run(run_id)).next_at == utc(2026, 12, 3, 1, 30)
    finally:
        await app.close()


async def test_the_end_is_computed_once_a_zone_changed_later_does_not_move_it(
    app: Kirim, clock: ManualClock, email: FlakyProvider
) -> None:
    """The wait's end is recorded when the step starts: the recipient moving to
    another zone meanwhile, and workers coming again, leave it where it was."""
    await app.set_preferences(Preferences(recipient_id="u1", timezone="Asia/Jakarta"))
    clock.set(utc(2026, 12, 2, 12))  # 19:00 in Jakarta (UTC+7)
    run_id = await _start(app)
    await drain(app)
    due = utc(2026, 12, 2, 18, 30)  # 01:30 WIB
    assert (await app.must_get_run(run_id)).next_at == due
    await app.set_preferences(Preferences(recipient_id="u1", timezone="America/New_York"))
    for _ in range(3):
        clock.advance(3600)
        await drain(app)
        assert (await app.must_get_run(run_id)).next_at == due
    assert email.requests == []
    clock.set(due)
    await drain(app)
    assert len(email.requests) == 1


async def test_run_show_and_the_dashboard_say_the_local_time_and_zone(
    app: Kirim, clock: ManualClock, database_url: str
) -> None:
    """``kirim run show`` and /dashboard/runs/N: "waits until <local time> (<zone>)"."""
    from click.testing import CliRunner

    from http_kit import api_on
    from kirim.cli import main
    from kirim.config import ServeSettings

    await app.set_preferences(Preferences(recipient_id="u1", timezone="America/New_York"))
    clock.set(utc(2026, 12, 2, 12))
    run_id = await _start(app)
    await drain(app)
    wanted = "waits until 2026-12-03 01:30 EST (America/New_York)"

    def cli(*args: str) -> str:
        done = CliRunner().invoke(main, ["--database", database_url, *args])
        assert done.exit_code == 0, done.output
        return done.output

    shown = await asyncio.to_thread(cli, "run", "show", str(run_id))
    assert "delay until 01:30" in shown
    assert wanted in shown
    as_json = json.loads(await asyncio.to_thread(cli, "status", f"run:{run_id}", "--json"))
    assert as_json["steps"][1]["local_until"] == "2026-12-03 01:30 EST (America/New_York)"
    async with api_on(app, settings=ServeSettings(allowed_hosts=("testserver",))) as api:
        page = await api.client.get(f"/dashboard/runs/{run_id}", headers={"Authorization": ""})
        assert page.status_code == 200
        text = re.sub(r"\s+", " ", page.text)
        assert wanted in text
        assert "delay until 01:30" in text
