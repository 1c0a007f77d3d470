"""The fan-out planner: one event, its recipients and their preferences -> the deliveries
to record (no store: ``plan`` is pure)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from kirim.errors import InvalidNotification, PayloadTooLarge, UnknownChannel
from kirim.keys import default_key, payload_hash
from kirim.model import DeliveryStatus
from kirim.notify import Recipient, RenderError, compose_digest, parse_type
from kirim.notify.fanout import Event, Planned, plan, prepare, recipients_of
from kirim.preferences import Preferences, Window
from kirim.store.base import DigestEvent, Throttle
from record_kit import delivery_row

CHANNELS = {"email", "push"}
#: 2026-12-01 12:00 UTC, a Tuesday
NOON = datetime(2026, 12, 1, 12, 0, tzinfo=UTC).timestamp()


def shipped(**more: Any) -> Any:
    return parse_type(
        "order_shipped",
        {
            "templates": {
                "email": {
                    "subject": "Order {{ order_id }}",
                    "id": {"subject": "Pesanan {{ order_id }}"},
                },
                "push": {"title": "Shipped {{ order_id }} to {{ kirim.recipient }}"},
            },
            **more,
        },
    )


def event(ntype: Any, recipients: Any, data: Any = None, **kw: Any) -> Event:
    return prepare(
        ntype,
        recipients,
        {"order_id": "48291"} if data is None else data,
        event_id=kw.pop("event_id", "evt-1"),
        channels=kw.pop("channels", CHANNELS),
        max_payload_bytes=kw.pop("max_payload_bytes", 65536),
    )


def planned(
    ntype: Any, recipients: Any, prefs: dict[str, Preferences] | None = None, **kw: Any
) -> list[Planned]:
    return plan(event(ntype, recipients, **kw), prefs or {}, now=NOON, max_attempts=5)


def by(items: list[Planned]) -> dict[tuple[str, str], Planned]:
    return {(p.recipient_id, p.channel): p for p in items}


# -- what each delivery is -------------------------------------------------------------


def test_one_delivery_per_recipient_and_channel_with_its_own_key() -> None:
    """Two recipients x two channels: four deliveries, each keyed by event, id, channel."""
    items = planned(shipped(), ["u1", Recipient("u2", to={"email": "u2@example.com"})])
    assert [(p.recipient_id, p.channel) for p in items] == [
        ("u1", "email"),
        ("u1", "push"),
        ("u2", "email"),
        ("u2", "push"),
    ]
    for p in items:
        d = p.delivery
        assert d.idempotency_key == default_key("evt-1", p.recipient_id, p.channel)
        assert (d.type, d.recipient_id, d.event_id, d.max_attempts) == (
            "order_shipped",
            p.recipient_id,
            "evt-1",
            5,
        )
        assert d.payload_hash == payload_hash(d.payload_json)
        assert (d.suppressed, d.throttle, d.digest, d.run_at) == (None, None, None, None)
    found = by(items)
    assert found[("u2", "email")].delivery.recipient == "u2@example.com"
    assert found[("u2", "push")].delivery.recipient == "u2"  # no address given: the id


def test_the_payload_is_the_rendered_message() -> None:
    """Each payload is {type, locale, parts}, in the recipient's locale."""
    items = by(planned(shipped(), [Recipient("u1", locale="id_ID"), "u2"]))
    assert json.loads(items[("u1", "email")].delivery.payload_json) == {
        "type": "order_shipped",
        "locale": "id",
        "subject": "Pesanan 48291",
    }
    assert json.loads(items[("u2", "push")].delivery.payload_json) == {
        "type": "order_shipped",
        "locale": "en",
        "title": "Shipped 48291 to u2",
    }


# -- preferences -----------------------------------------------------------------------


def test_an_opted_out_recipient_is_suppressed_with_the_reason() -> None:
    """Opt-out: every channel's delivery is recorded suppressed (never silently dropped)."""
    prefs = {"u1": Preferences(recipient_id="u1", opt_out=True)}
    items = by(planned(shipped(), ["u1", "u2"], prefs))
    assert items[("u1", "email")].delivery.suppressed == "opted_out"
    assert items[("u1", "push")].delivery.suppressed == "opted_out"
    assert items[("u2", "email")].delivery.suppressed is None


def test_a_critical_type_ignores_the_opt_out() -> None:
    """A critical type goes to a recipient who opted out."""
    prefs = {"u1": Preferences(recipient_id="u1", opt_out=True)}
    items = planned(shipped(critical=True), ["u1"], prefs)
    assert [p.delivery.suppressed for p in items] == [None, None]


def test_a_channel_opt_out_and_a_default_off() -> None:
    """Off on one channel; a type off by default on push needs an opt-in."""
    prefs = {"u1": Preferences(recipient_id="u1", channels={"order_shipped:email": False})}
    items = by(planned(shipped(defaults={"push": False}), ["u1", "u2"], prefs))
    assert items[("u1", "email")].delivery.suppressed == "channel_opted_out"
    assert items[("u1", "push")].delivery.suppressed == "not_opted_in"
    assert items[("u2", "email")].delivery.suppressed is None


def test_quiet_hours_defer_to_their_end_in_the_recipient_zone() -> None:
    """Noon UTC is 19:00 in Jakarta; quiet 18:00-07:00 there: due at 07:00 local."""
    quiet = Window.parse("18:00-07:00")
    prefs = {"u1": Preferences(recipient_id="u1", timezone="Asia/Jakarta", quiet_hours=quiet)}
    items = planned(shipped(), ["u1"], prefs)
    opening = datetime(2026, 12, 2, 0, 0, tzinfo=UTC).timestamp()  # 07:00 in Jakarta
    assert [p.delivery.run_at for p in items] == [opening, opening]
    assert items[0].verdict.action == "defer"


def test_the_type_window_defers_too() -> None:
    """A type sent only 08:00-11:00 (UTC here): at noon it waits for tomorrow's 08:00."""
    items = planned(shipped(window="08:00-11:00"), ["u1"])
    assert items[0].delivery.run_at == datetime(2026, 12, 2, 8, 0, tzinfo=UTC).timestamp()


# -- throttle and digest ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "scope"),
    [
        ({"per": "recipient"}, "recipient:u%3A1:push"),
        ({"per": "type"}, "type:order_shipped:u%3A1:push"),
        ({"per": "key", "key": "shop"}, "key:order_shipped:s%3A9:u%3A1:push"),
    ],
)
def test_a_throttle_scope_names_the_recipient_and_channel(rule: dict[str, str], scope: str) -> None:
    """The scope always holds recipient id and channel; ':' in a part is escaped."""
    ntype = shipped(throttle={"limit": 3, "window": "1h", "over": "defer", **rule})
    items = by(planned(ntype, ["u:1"], data={"order_id": "1", "shop": "s:9"}))
    assert items[("u:1", "push")].delivery.throttle == Throttle(
        scope=scope, limit=3, window=3600.0, over="defer"
    )


def test_a_suppressed_delivery_is_not_throttled() -> None:
    """Only deliveries that may go count against a throttle."""
    prefs = {"u1": Preferences(recipient_id="u1", opt_out=True)}
    ntype = shipped(throttle={"limit": 3, "window": "1h"})
    assert [p.delivery.throttle for p in planned(ntype, ["u1"], prefs)] == [None, None]


def test_a_digest_event_carries_its_stream_and_a_placeholder() -> None:
    """A digest type's delivery is an event for the stream type|recipient|channel|key."""
    ntype = parse_type(
        "post_liked",
        {
            "digest": {"window": "10m", "key": "post"},
            "templates": {"push": {"title": "{{ count }} likes on {{ events[0].post }}"}},
        },
    )
    data = {"post": "p|7", "by": "ana"}
    [item] = planned(ntype, [Recipient("u1", locale="id")], data=data, event_id="like-1")
    stream = "post_liked|u1|push|p%7C7"
    assert item.delivery.digest == DigestEvent(
        stream=stream,
        window=600.0,
        event_id="like-1",
        data_json=json.dumps(data, sort_keys=True, separators=(",", ":")),
    )
    assert json.loads(item.delivery.payload_json) == {
        "type": "post_liked",
        "locale": "id",
        "digest": stream,
        "events": [],
    }


def test_a_suppressed_digest_event_is_recorded_as_itself() -> None:
    """Suppressed: no digest, and the payload is the event as its digest would show it."""
    ntype = parse_type(
        "post_liked",
        {"digest": {"window": "10m"}, "templates": {"push": {"title": "{{ count }} likes"}}},
    )
    prefs = {"u1": Preferences(recipient_id="u1", opt_out=True)}
    [item] = planned(ntype, ["u1"], prefs, data={})
    assert item.delivery.digest is None
    assert item.delivery.suppressed == "opted_out"
    assert json.loads(item.delivery.payload_json)["title"] == "1 likes"


def test_compose_digest_renders_the_events_in_the_first_locale() -> None:
    """The seal's payload: the templates with events and count, their ids listed."""
    ntype = parse_type(
        "post_liked",
        {
            "digest": {"window": "10m"},
            "templates": {
                "push": {
                    "title": "{{ count }} likes: {% for e in events %}{{ e.by }} {% endfor %}",
                    "id": {
                        "title": "{{ count }} suka: {{ events | map(attribute='by') | join(', ') }}"
                    },
                }
            },
        },
    )
    delivery = delivery_row(
        event_id="like-1",
        recipient="u1",
        payload={"type": "post_liked", "locale": "id_ID", "digest": "s", "events": []},
        status=DeliveryStatus.PROCESSING,
        claim_token="t",
        claimed_by="w",
        type="post_liked",
        recipient_id="u1",
    )
    events = [
        {"event_id": "like-1", "data": {"by": "ana"}, "at": 1.0},
        {"event_id": "like-2", "data": {"by": "budi"}, "at": 2.0},
    ]
    assert compose_digest(ntype, delivery, events) == {
        "type": "post_liked",
        "locale": "id",
        "title": "2 suka: ana, budi",
        "digest": "s",
        "count": 2,
        "events": ["like-1", "like-2"],
    }


# -- what is refused before anything is read -------------------------------------------


def test_recipients_are_checked_and_counted_once() -> None:
    """The same recipient twice is one; twice with other details is an error."""
    assert recipients_of(["u1", "u1", {"id": "u2", "locale": "id-ID"}]) == (
        Recipient("u1"),
        Recipient("u2", locale="id_ID"),
    )
    assert recipients_of("u1") == (Recipient("u1"),)
    with pytest.raises(InvalidNotification, match="listed twice, differently"):
        recipients_of(["u1", Recipient("u1", locale="id")])
    with pytest.raises(InvalidNotification, match=r"recipients\[0\]\.locale"):
        recipients_of([{"id": "u1", "locale": "klingon"}])
    with pytest.raises(InvalidNotification, match=r"recipients\[1\]: unknown key\(s\) email"):
        recipients_of(["u1", {"id": "u2", "email": "x"}])
    with pytest.raises(InvalidNotification, match="non-empty list"):
        recipients_of([])
    with pytest.raises(InvalidNotification, match=r"recipients\[0\]\.id is required"):
        recipients_of([{"id": " "}])


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"channels": {"push"}}, UnknownChannel, "unknown channel 'email'"),
        ({"data": ["not", "a", "mapping"]}, InvalidNotification, "data must be a JSON object"),
        ({"data": {"order_id": float("nan")}}, InvalidNotification, "data is not JSON"),
        ({"data": {"order_id": "x\x00"}}, InvalidNotification, "NUL"),
        ({"data": {}}, RenderError, "'order_id' is undefined"),
        ({"event_id": ""}, InvalidNotification, "event_id is required"),
        ({"max_payload_bytes": 40}, PayloadTooLarge, "over the limit"),
    ],
)
def test_a_bad_event_is_refused_whole(change: dict[str, Any], error: type, match: str) -> None:
    """Any problem raises before a single delivery is planned."""
    with pytest.raises(error, match=match):
        event(shipped(), ["u1"], **change)


def test_a_grouping_field_must_be_in_the_data() -> None:
    """A digest or throttle by a data field needs that field."""
    ntype = shipped(throttle={"limit": 1, "window": "1h", "per": "key", "key": "shop"})
    with pytest.raises(InvalidNotification, match="groups by data field 'shop'"):
        event(ntype, ["u1"])


def test_an_event_deliverys_due_time_is_iso_8601_like_every_other_time() -> None:
    """The JSON of an event's delivery (POST /v1/events, kirim event --json) gives
    run_at as ISO-8601 UTC, as a job's run_at and every other time is given."""
    import dataclasses

    from kirim.notify.fanout import EventDelivery
    from kirim.views import iso

    due = datetime(2026, 12, 2, 8, 0, tzinfo=UTC).timestamp()
    entry = EventDelivery(
        recipient_id="1007", channel="push", delivery_id=4, idempotency_key="k",
        created=True, status=DeliveryStatus.PENDING, run_at=due,
    )  # fmt: skip
    assert entry.to_json()["run_at"] == "2026-12-02T08:00:00.000Z" == iso(due)
    assert dataclasses.replace(entry, run_at=None).to_json()["run_at"] is None
