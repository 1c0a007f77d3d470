"""Recipients' addresses on both backends: kept, listed, retired and removed; an event
fans out to each device of a recipient as a delivery of its own; a token the service
calls dead is retired by the worker and never used again, while the others go on."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from kirim.channels import Channel
from kirim.config import Config
from kirim.devtools.services.apns import ApnsFake
from kirim.engine import Kirim
from kirim.errors import UnknownChannel
from kirim.keys import default_key, device_key
from kirim.model import DeliveryStatus
from kirim.notify.types import parse_type
from kirim.providers.apns import ApnsProvider
from kirim.testing import FlakyProvider, ManualClock
from kirim.validation import BadValue
from kirim.worker import WorkerSettings

PHONE_A, PHONE_B, TABLET = "a1" * 32, "b2" * 32, "c3" * 32
SHIPPED = parse_type(
    "shipped", {"templates": {"ios": {"title": "Order {{ n }}", "body": "on its way"}}}
)
SETTINGS = WorkerSettings(lease=30.0, backoff_base=1.0, backoff_max=1.0)


@pytest.fixture
def apns(tmp_path: Path) -> Iterator[ApnsFake]:
    with ApnsFake(tmp_path) as fake:
        yield fake


@pytest.fixture
async def app(database_url: str, clock: ManualClock, apns: ApnsFake) -> AsyncIterator[Kirim]:
    provider = ApnsProvider(
        team_id=apns.team_id,
        key_id=apns.key_id,
        private_key=apns.private_key,
        topic=apns.topic,
        url=apns.url,
        ca_file=str(apns.ca_file),
        timeout=5.0,
    )
    channels = {
        "ios": Channel(name="ios", provider=provider),
        "hook": Channel(name="hook", provider=FlakyProvider()),
    }
    kirim = Kirim(Config(database=database_url), channels=channels, clock=clock, types=[SHIPPED])
    await kirim.open(migrate=True)
    yield kirim
    await kirim.close()


async def drain(app: Kirim) -> None:
    worker = app.worker(settings=SETTINGS)
    while await worker.run_once():
        pass


async def test_addresses_are_kept_listed_retired_and_removed(
    app: Kirim, clock: ManualClock
) -> None:
    """An address is stored as checked and listed with its label; a retired one is kept
    and marked, and adding it again registers it anew; removing forgets it."""
    added = await app.add_address("u1", "ios", PHONE_A.upper(), label="Ana's iPhone")
    assert (added.address, added.label, added.retired) == (PHONE_A.upper(), "Ana's iPhone", False)
    await app.add_address("u1", "ios", PHONE_B)
    clock.advance(5)
    assert await app.retire_address("ios", PHONE_B, reason="Unregistered") == 1
    assert await app.retire_address("ios", PHONE_B, reason="again") == 0
    listed = {a.address: a for a in await app.addresses("u1")}
    assert listed[PHONE_B].retired_at == clock.now()
    assert listed[PHONE_B].retired_reason == "Unregistered"
    assert not listed[PHONE_A.upper()].retired
    assert (await app.store.retired_addresses()) == {"ios": 1}
    again = await app.add_address("u1", "ios", PHONE_B)
    assert not again.retired
    assert again.added_at == clock.now()
    assert await app.remove_address("u1", "ios", PHONE_B)
    assert not await app.remove_address("u1", "ios", PHONE_B)
    assert [a.address for a in await app.addresses("u1")] == [PHONE_A.upper()]


@pytest.mark.parametrize(
    ("channel", "address", "what"),
    [
        ("ios", "not-hex", "APNs device token"),
        ("ios", "ab" * 600, "at most"),
        ("ios", "ab" * 120, "32 to 200"),
        ("nope", PHONE_A, "unknown channel"),
    ],
)
async def test_a_bad_address_is_refused_naming_what_is_wrong(
    app: Kirim, channel: str, address: str, what: str
) -> None:
    """An address the channel's provider cannot take, or a channel not configured, is
    refused with the reason; nothing is written."""
    with pytest.raises((BadValue, UnknownChannel), match=what):
        await app.add_address("u1", channel, address)
    assert await app.addresses("u1") == []


async def test_an_event_fans_out_to_each_device_with_a_key_of_its_own(
    app: Kirim, apns: ApnsFake
) -> None:
    """Two devices make two deliveries with keys of their own; the same event again
    makes none; each device shows the notification once."""
    await app.add_address("u1", "ios", PHONE_A)
    await app.add_address("u1", "ios", TABLET)
    first = await app.notify_event("shipped", ["u1"], {"n": 7}, event_id="ev-1")
    keys = {d.address: d.idempotency_key for d in first.deliveries}
    assert keys == {
        PHONE_A: device_key("ev-1", "u1", "ios", PHONE_A),
        TABLET: device_key("ev-1", "u1", "ios", TABLET),
    }
    again = await app.notify_event("shipped", ["u1"], {"n": 7}, event_id="ev-1")
    assert [d.created for d in again.deliveries] == [False, False]
    await drain(app)
    for d in first.deliveries:
        record = await app.get(d.delivery_id, by="id")
        assert record is not None
        assert record.delivery.status is DeliveryStatus.SENT
        assert record.delivery.recipient == d.address
    assert sorted(apns.screens) == sorted([PHONE_A, TABLET])
    assert apns.duplicated() == 0


async def test_a_dead_token_is_retired_and_the_other_devices_go_on(
    app: Kirim, apns: ApnsFake
) -> None:
    """APNs answers 410 Unregistered for one device: that delivery fails, the worker
    retires the token, the other device gets its notification, and the next event
    goes to the living device only."""
    await app.add_address("u1", "ios", PHONE_A)
    await app.add_address("u1", "ios", PHONE_B)
    apns.dead.add(PHONE_B)
    first = await app.notify_event("shipped", ["u1"], {"n": 1}, event_id="ev-1")
    await drain(app)
    status = {}
    for d in first.deliveries:
        record = await app.get(d.delivery_id, by="id")
        assert record is not None
        status[d.address] = record.delivery.status
    assert status == {PHONE_A: DeliveryStatus.SENT, PHONE_B: DeliveryStatus.FAILED}
    listed = {a.address: a for a in await app.addresses("u1")}
    assert listed[PHONE_B].retired
    assert "Unregistered" in (listed[PHONE_B].retired_reason or "")
    assert not listed[PHONE_A].retired
    second = await app.notify_event("shipped", ["u1"], {"n": 2}, event_id="ev-2")
    assert [d.address for d in second.deliveries] == [PHONE_A]
    await drain(app)
    assert apns.refused["Unregistered"] == 1  # the dead token was asked once, never again


async def test_a_recipient_whose_devices_are_all_retired_is_suppressed(app: Kirim) -> None:
    """On a channel that needs an address, a recipient without one gets a suppressed
    delivery (no_address), never sent; a channel that needs none goes to the id."""
    await app.add_address("u1", "ios", PHONE_A)
    await app.retire_address("ios", PHONE_A, reason="Unregistered")
    result = await app.notify_event("shipped", ["u1"], {"n": 1}, event_id="ev-1")
    [d] = result.deliveries
    assert (d.status, d.reason, d.address) == (DeliveryStatus.SUPPRESSED, "no_address", None)
    assert d.idempotency_key == default_key("ev-1", "u1", "ios")


async def test_to_names_the_address_and_skips_the_fan_out(app: Kirim) -> None:
    """A recipient given with ``to`` for the channel goes there alone, as before."""
    await app.add_address("u1", "ios", PHONE_A)
    result = await app.notify_event(
        "shipped", [{"id": "u1", "to": {"ios": TABLET}}], {"n": 1}, event_id="ev-1"
    )
    [d] = result.deliveries
    assert d.address is None
    record = await app.get(d.delivery_id, by="id")
    assert record is not None
    assert record.delivery.recipient == TABLET
