"""The service providers through kirim's worker on both backends: a lost answer, a
rate limit and a dead address each end as the service's guard allows (a push resent
and shown once, an SMS assumed sent and never resent)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from py_vapid import Vapid02

from kirim.channels import Channel
from kirim.config import Config
from kirim.devtools.services.apns import ApnsFake
from kirim.devtools.services.base import ServiceFake
from kirim.devtools.services.fcm import FcmFake
from kirim.devtools.services.twilio import TwilioFake
from kirim.devtools.services.webpush import WebPushFake
from kirim.engine import Kirim
from kirim.model import DeliveryStatus, Doubt
from kirim.providers.apns import ApnsProvider
from kirim.providers.fcm import FcmProvider
from kirim.providers.twilio import TwilioProvider
from kirim.providers.webpush import WebPushProvider
from kirim.testing import ManualClock
from kirim.worker import WorkerSettings

SETTINGS = WorkerSettings(lease=30.0, backoff_base=1.0, backoff_max=1.0, request_timeout=5.0)
SERVICES = ("apns", "fcm", "webpush", "twilio")


@pytest.fixture(params=SERVICES)
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Any, Any, str]]:
    """(name, fake, provider, address) of one service."""
    name = request.param
    fake: Any
    if name == "apns":
        with ApnsFake(tmp_path) as fake:
            provider = ApnsProvider(
                team_id=fake.team_id,
                key_id=fake.key_id,
                private_key=fake.private_key,
                topic=fake.topic,
                url=fake.url,
                ca_file=str(fake.ca_file),
                timeout=2.0,
            )
            yield name, fake, provider, "ab" * 32
    elif name == "fcm":
        with FcmFake() as fake:
            yield name, fake, FcmProvider(account=fake.account, url=fake.url, timeout=2.0), "t" * 40
    elif name == "webpush":
        vapid = Vapid02()
        vapid.generate_keys()
        with WebPushFake() as fake:
            provider = WebPushProvider(
                vapid_private_key=vapid.private_pem().decode(),
                vapid_subject="mailto:ops@example.com",
                timeout=2.0,
            )
            yield name, fake, provider, fake.subscribe()
    else:
        with TwilioFake() as fake:
            provider = TwilioProvider(
                account_sid=fake.account_sid,
                auth_token=fake.auth_token,
                from_number=fake.sender,
                url=fake.url,
                timeout=2.0,
            )
            yield name, fake, provider, "+15551230000"


@pytest.fixture
async def app(
    database_url: str, clock: ManualClock, service: tuple[str, Any, Any, str]
) -> AsyncIterator[Kirim]:
    channels = {"c": Channel(name="c", provider=service[2])}
    kirim = Kirim(Config(database=database_url), channels=channels, clock=clock)
    await kirim.open(migrate=True)
    yield kirim
    await kirim.close()


async def run(app: Kirim, clock: ManualClock, rounds: int = 4) -> None:
    worker = app.worker(settings=SETTINGS)
    for _ in range(rounds):
        await worker.run_once()
        clock.advance(10.0)


async def deliver(app: Kirim, clock: ManualClock, address: str) -> Any:
    made = await app.notify("e-1", address, "c", {"title": "Shipped", "body": "Order 7"})
    await run(app, clock)
    record = await app.get(made.delivery_id, by="id")
    assert record is not None
    return record


async def test_a_lost_answer_is_resent_where_the_device_collapses(
    app: Kirim, clock: ManualClock, service: tuple[str, ServiceFake, Any, str]
) -> None:
    """The service delivered and the answer was lost: a push is sent again with the
    delivery's collapse id and the device shows it once; an SMS (no key, no collapse)
    is assumed sent and never sent again."""
    name, fake, _, address = service
    fake.script = ["lost"]
    d, _, attempts = await deliver(app, clock, address)
    shown = sum(fake._copies.values())
    if name == "twilio":
        assert (d.status, d.doubt, len(attempts)) == (DeliveryStatus.SENT, Doubt.ASSUMED_SENT, 1)
    else:
        assert (d.status, d.doubt, len(attempts)) == (DeliveryStatus.SENT, None, 2)
    assert shown == 1
    assert fake.duplicated() == 0


async def test_a_rate_limit_is_retried_after_and_sent_once(
    app: Kirim, clock: ManualClock, service: tuple[str, ServiceFake, Any, str]
) -> None:
    """A 429 was not processed: retried (no sooner than its Retry-After), then sent;
    the user has one."""
    _, fake, _, address = service
    fake.script = ["limited"]
    d, _, attempts = await deliver(app, clock, address)
    assert d.status is DeliveryStatus.SENT
    assert d.doubt is None
    assert [a.status.value for a in attempts] == ["failed_transient", "succeeded"]
    assert sum(fake._copies.values()) == 1


async def test_a_dead_address_fails_the_delivery_and_is_never_retried(
    app: Kirim, clock: ManualClock, service: tuple[str, ServiceFake, Any, str]
) -> None:
    """The service calls the address dead (or the recipient replied STOP): the delivery
    fails at once, with the service's reason, after one request."""
    name, fake, _, address = service
    if name == "webpush":
        fake.kill(address)  # type: ignore[attr-defined]
    else:
        fake.dead.add(address)
    d, _, attempts = await deliver(app, clock, address)
    assert d.status is DeliveryStatus.FAILED
    assert len(attempts) == 1
    reason = {"apns": "Unregistered", "fcm": "UNREGISTERED", "webpush": "410", "twilio": "21610"}
    assert reason[name] in (d.last_error or "")
