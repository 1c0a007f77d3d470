"""The HTTP service's parts: the Idempotency-Key header, fingerprints, times, the
timeline of a race, the [serve] table, the token cache."""

from __future__ import annotations

import pytest

from kirim.config import ServeSettings, parse_config
from kirim.errors import ConfigError
from kirim.http.auth import TokenVerifier
from kirim.http.errors import ApiError
from kirim.http.idempotency import fingerprint, header_key
from kirim.http.models import parse_when
from kirim.model import (
    Attempt,
    AttemptStatus,
    Delivery,
    DeliveryStatus,
    Doubt,
    Job,
    JobStatus,
    Record,
)
from kirim.store.base import ApiToken
from kirim.timeline import events
from kirim.tokens import check_name, hash_token
from record_kit import delivery_row, job_row

T0 = 1_800_000_000.0


@pytest.mark.parametrize(
    ("value", "key"),
    [
        ("abc", "abc"),
        ("  abc  ", "abc"),
        ('"8e03978e-40d5"', "8e03978e-40d5"),
        ('"a\\"b\\\\c"', 'a"b\\c'),
        (None, None),
    ],
)
def test_header_key_is_bare_or_a_structured_string(value, key) -> None:
    assert header_key(value) == key


@pytest.mark.parametrize("value", ["", '""', "k" * 256, "caf\u00e9", '"a"b"', "\t"])
def test_bad_header_keys_are_400(value) -> None:
    with pytest.raises(ApiError) as caught:
        header_key(value)
    assert caught.value.status == 400
    assert caught.value.details[0]["field"] == "header.idempotency-key"


def test_the_fingerprint_is_of_the_canonical_body() -> None:
    """Key order does not matter; any value does."""
    assert fingerprint({"a": 1, "b": [1, 2]}) == fingerprint({"b": [1, 2], "a": 1})
    assert fingerprint({"a": 1}) != fingerprint({"a": 1.5})
    assert fingerprint({"a": 1}) != fingerprint({"a": 1, "key": None})


@pytest.mark.parametrize(
    "text", ["2030-01-01T09:00:00Z", "2030-01-01T09:00:00.125+07:00", "0001-01-02T00:00:00Z"]
)
def test_send_after_accepts_rfc3339(text) -> None:
    assert parse_when(text).tzinfo is not None


@pytest.mark.parametrize(
    "text",
    ["2030-01-01T09:00:00", "soon", "9999-12-31T20:00:00-12:00", "0001-01-01T00:00:00+14:00"],
)
def test_send_after_refuses_naive_or_out_of_range(text) -> None:
    with pytest.raises(ValueError, match="must"):
        parse_when(text)


def _delivery(**kw) -> Delivery:
    base = {
        "id": 7,
        "event_id": "order-7",
        "status": DeliveryStatus.SENT,
        "provider_message_id": "p-1",
        "created_at": T0,
        "updated_at": T0 + 9,
        "sent_at": T0 + 9,
    }
    return delivery_row(**(base | kw))


def _attempt(n: int, worker: str, at: float, done: float | None, status: AttemptStatus) -> Attempt:
    return Attempt(
        id=n,
        delivery_id=7,
        job_id=9381,
        number=n,
        provider_request_id=f"req-{n}",
        worker_id=worker,
        status=status,
        provider_message_id="p-1" if status is AttemptStatus.SUCCEEDED else None,
        error=None,
        requested_at=at,
        completed_at=done,
    )


def _job(**kw) -> Job:
    base = {
        "id": 9381,
        "delivery_id": 7,
        "status": JobStatus.COMPLETED,
        "run_at": T0,
        "attempts": 2,
        "max_attempts": 8,
        "created_at": T0,
        "updated_at": T0 + 9,
    }
    return job_row(**(base | kw))


def test_the_timeline_shows_the_write_ups_race_at_a_glance() -> None:
    """A slow answer, a second worker taking over meanwhile, the late answer: warned."""
    attempts = [
        _attempt(1, "A", T0 + 1.125, T0 + 8.0, AttemptStatus.SUCCEEDED),  # slow, late
        _attempt(2, "B", T0 + 5.0, T0 + 5.5, AttemptStatus.SUCCEEDED),
    ]
    found = events(Record(_delivery(), _job(), attempts), now=T0 + 20)
    lines = [e.line for e in found]
    assert lines[0] == (
        "2027-01-15T08:00:00.000Z job_id=9381 action=enqueued notification_id=7 "
        "event_id=order-7 channel=push"
    )
    assert lines[1] == (
        "2027-01-15T08:00:01.125Z worker=A job_id=9381 attempt=1 action=provider_request "
        "request_id=req-1"
    )
    takeover = next(e for e in found if e.action == "claim_taken_over")
    assert takeover.warn
    assert "from=A unanswered=req-1" in takeover.line
    second = next(e for e in found if e.action == "provider_request" and "attempt=2" in e.line)
    assert second.warn
    assert second.line.endswith("overlaps=attempt:1")
    late = next(e for e in found if e.action == "provider_response" and "attempt=1" in e.line)
    assert late.warn
    assert late.line.endswith("late=true")
    assert [e.at for e in found] == sorted(e.at for e in found)


def test_the_timeline_of_a_quiet_delivery_has_no_warning() -> None:
    attempts = [_attempt(1, "A", T0 + 1, T0 + 1.2, AttemptStatus.SUCCEEDED)]
    found = events(Record(_delivery(), _job(attempts=1), attempts), now=T0 + 20)
    assert not any(e.warn for e in found)
    assert [e.action for e in found] == [
        "enqueued",
        "provider_request",
        "provider_response",
        "status_write",
        "job_state",
    ]


def test_the_timeline_shows_expired_leases_and_doubt() -> None:
    """A running job past its lease and an unanswered request are warnings."""
    running = _job(status=JobStatus.RUNNING, lease_owner="A", lease_expires_at=T0 + 10)
    d = _delivery(
        status=DeliveryStatus.IN_DOUBT,
        doubt=Doubt.HELD,
        sent_at=None,
        last_error='timeout "x"',
    )
    attempts = [_attempt(1, "A", T0 + 1, None, AttemptStatus.REQUESTED)]
    found = events(Record(d, running, attempts), now=T0 + 20)
    by_action = {e.action: e for e in found}
    assert by_action["lease_expired"].warn
    assert by_action["provider_request"].line.endswith("answer=none_recorded")
    assert by_action["status_write"].line.endswith('doubt=held error="timeout \\"x\\""')


def test_the_serve_table() -> None:
    """Defaults, values, and one-line errors for bad keys and values."""
    assert parse_config({}).serve == ServeSettings()
    serve = parse_config(
        {"serve": {"host": "0.0.0.0", "port": 9000, "protect_metrics": True}}
    ).serve
    assert (serve.host, serve.port, serve.protect_metrics) == ("0.0.0.0", 9000, True)
    assert serve.protect_dashboard is False
    for bad in (
        {"hots": "x"},
        {"port": 70000},
        {"port": "80"},
        {"protect_dashboard": "yes"},
        {"max_body_bytes": 10},
    ):
        with pytest.raises(ConfigError, match="serve"):
            parse_config({"serve": bad})


def test_serve_allowed_hosts() -> None:
    """The loopback names by default; a list of host names; one-line errors otherwise."""
    assert parse_config({}).serve.allowed_hosts == ("127.0.0.1", "localhost", "::1")
    hosts = ["kirim.internal", "10.0.0.5", "[::1]"]
    assert parse_config({"serve": {"allowed_hosts": hosts}}).serve.allowed_hosts == tuple(hosts)
    for bad in ("localhost", [], [""], [1], ["a b"], ["http://x/"], ["caf\u00e9"]):
        with pytest.raises(ConfigError, match=r"serve\.allowed_hosts must be"):
            parse_config({"serve": {"allowed_hosts": bad}})


@pytest.mark.parametrize("name", ["ci", "billing-service", "a.b@c_d", "x" * 64])
def test_token_names(name) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["", "42", "-x", "a b", "x" * 65, "é"])
def test_bad_token_names(name) -> None:
    with pytest.raises(ConfigError, match="token name"):
        check_name(name)


class _Store:
    def __init__(self) -> None:
        self.calls = 0
        self.valid = {hash_token("good")}

    async def verify_token(self, digest: str) -> ApiToken | None:
        self.calls += 1
        if digest not in self.valid:
            return None
        return ApiToken(id=1, name="ci", prefix="kirim_good", created_at=0.0, revoked_at=None)


async def test_the_verifier_remembers_good_tokens_for_its_ttl() -> None:
    """One store read per token per ttl; unknown tokens are always asked."""
    store = _Store()
    verifier = TokenVerifier(store, ttl=60)  # type: ignore[arg-type]
    assert (await verifier.verify("good")) is not None
    assert (await verifier.verify("good")) is not None
    assert store.calls == 1
    assert await verifier.verify("bad") is None
    assert await verifier.verify("bad") is None
    assert store.calls == 3
    assert await verifier.verify("") is None
    assert await verifier.verify("x" * 600) is None
    assert store.calls == 3
    uncached = TokenVerifier(store, ttl=0)  # type: ignore[arg-type]
    await uncached.verify("good")
    await uncached.verify("good")
    assert store.calls == 5
