"""Each service provider against its loopback fake: every failure classified by where
it happened (not sent, the service's own answer, or ambiguous), 429 carrying
Retry-After, dead addresses named, and no credential in any error or repr."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from py_vapid import Vapid02

from kirim.devtools.receiver import Behaviour
from kirim.devtools.services.apns import ApnsFake, signing_key
from kirim.devtools.services.fcm import FcmFake
from kirim.devtools.services.slack import SlackFake
from kirim.devtools.services.twilio import TwilioFake
from kirim.devtools.services.webpush import WebPushFake
from kirim.errors import (
    AmbiguousFailure,
    DeadAddress,
    NotSent,
    PermanentFailure,
    ProviderError,
    TransientFailure,
)
from kirim.providers.apns import ApnsProvider
from kirim.providers.base import Message, Sent
from kirim.providers.exchange import collapse_id
from kirim.providers.fcm import FcmProvider
from kirim.providers.slack import SlackProvider
from kirim.providers.twilio import TwilioProvider
from kirim.providers.webpush import WebPushProvider

TOKEN = "ab" * 32
FCM_TOKEN = "fcm-" + "x" * 40
PHONE = "+15551234567"
ALWAYS = 1.0


def message(recipient: str, *, key: str = "k-1", payload: Any = None) -> Message:
    return Message(
        delivery_id=1,
        idempotency_key=key,
        provider_request_id="req-1",
        event_id="e-1",
        recipient=recipient,
        channel="c",
        payload={"title": "Shipped", "body": "Order 7"} if payload is None else payload,
        attempt=1,
    )


def send(provider: Any, m: Message) -> Sent:
    async def go() -> Sent:
        try:
            result: Sent = await provider.send(m)
            return result
        finally:
            await provider.aclose()

    return asyncio.run(go())


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the fakes and the providers on them --------------------------------------------


def faults(**rates: float) -> Behaviour:
    return Behaviour(hang_s=1.5, **rates)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return tmp_path


def apns(fake: ApnsFake, **kw: Any) -> ApnsProvider:
    return ApnsProvider(
        team_id=fake.team_id,
        key_id=fake.key_id,
        private_key=fake.private_key,
        topic=fake.topic,
        url=kw.pop("url", fake.url),
        ca_file=str(fake.ca_file),
        timeout=1.0,
        **kw,
    )


def fcm(fake: FcmFake, **kw: Any) -> FcmProvider:
    return FcmProvider(account=fake.account, url=kw.pop("url", fake.url), timeout=1.0, **kw)


VAPID = Vapid02()
VAPID.generate_keys()
VAPID_PEM = VAPID.private_pem().decode()


def webpush(**kw: Any) -> WebPushProvider:
    return WebPushProvider(
        vapid_private_key=VAPID_PEM, vapid_subject="mailto:ops@example.com", timeout=1.0, **kw
    )


def twilio(fake: TwilioFake, **kw: Any) -> TwilioProvider:
    return TwilioProvider(
        account_sid=fake.account_sid,
        auth_token=kw.pop("auth_token", fake.auth_token),
        from_number=fake.sender,
        url=kw.pop("url", fake.url),
        timeout=1.0,
    )


def slack(fake: SlackFake, **kw: Any) -> SlackProvider:
    return SlackProvider(token=kw.pop("token", fake.token), url=fake.url, timeout=1.0, **kw)


@pytest.fixture
def apns_fake(folder: Path, request: pytest.FixtureRequest) -> Iterator[ApnsFake]:
    with ApnsFake(folder, behaviour=getattr(request, "param", None)) as fake:
        yield fake


# -- APNs -----------------------------------------------------------------------------


def test_apns_accepts_with_the_keys_own_ids_and_the_device_shows_one(folder: Path) -> None:
    """Two sends of one key carry one apns-id and one collapse id: APNs answers 200
    both times (its message id the echoed apns-id) and the device shows one."""
    with ApnsFake(folder) as fake:
        first = send(apns(fake), message(TOKEN))
        second = send(apns(fake), message(TOKEN))
    assert first == second
    assert first.provider_message_id == fake.apns_ids[0]
    assert len(set(fake.apns_ids)) == 1
    assert sum(fake.requests.values()) == 2
    assert fake.duplicated() == 0
    assert list(fake.screens[TOKEN]) == [collapse_id("k-1")]


@pytest.mark.parametrize(
    ("setup", "kind", "reason"),
    [
        ("dead", DeadAddress, "Unregistered"),
        ("bad_topic", PermanentFailure, "BadTopic"),
        ("big", NotSent, "over APNs' 4096"),
        ("bad_token", NotSent, "hexadecimal"),
        ("wrong_key", PermanentFailure, "InvalidProviderToken"),
    ],
)
def test_apns_classifies_its_documented_answers(
    folder: Path, setup: str, kind: type[ProviderError], reason: str
) -> None:
    """Apple's refusals keep their class: a dead token names the address, a bad topic
    or a key Apple does not know is permanent, and what cannot be sent never leaves."""
    with ApnsFake(folder) as fake:
        m, provider = message(TOKEN), apns(fake)
        if setup == "dead":
            fake.dead.add(TOKEN)
        elif setup == "bad_topic":
            provider.topic = "com.other.app"
        elif setup == "big":
            m = message(TOKEN, payload={"title": "x", "body": "y" * 5000})
        elif setup == "bad_token":
            m = message("not-a-token")
        elif setup == "wrong_key":  # another team's key
            provider._key, provider._token = signing_key()[0], None
        with pytest.raises(kind, match=reason) as raised:
            send(provider, m)
    if setup == "dead":
        assert isinstance(raised.value, DeadAddress)
        assert raised.value.address == TOKEN
    if kind is NotSent:
        assert sum(fake.requests.values()) == 0
        assert not fake.refused


@pytest.mark.parametrize(
    ("rates", "kind", "shown"),
    [
        ({"limit_rate": ALWAYS}, TransientFailure, 0),
        ({"error_rate": ALWAYS}, AmbiguousFailure, 0),
        ({"lost_rate": ALWAYS}, AmbiguousFailure, 1),
        ({"hang_rate": ALWAYS}, AmbiguousFailure, 1),
    ],
)
def test_apns_rate_limits_errors_lost_answers_and_timeouts(
    folder: Path, rates: dict[str, float], kind: type[ProviderError], shown: int
) -> None:
    """429 is not processed (retried), a 5xx and an answer lost or too late after
    delivery are ambiguous; the device shows what was delivered."""
    with ApnsFake(folder, behaviour=faults(**rates)) as fake:
        with pytest.raises(kind):
            send(apns(fake), message(TOKEN))
        assert sum(fake._copies.values()) == shown


def test_apns_refused_connection_is_certainly_not_sent(folder: Path) -> None:
    """Nothing listening: the request never left (TransientFailure, not sent)."""
    with ApnsFake(folder) as fake:
        provider = apns(fake, url=f"https://127.0.0.1:{closed_port()}")
    with pytest.raises(TransientFailure, match="not sent"):
        send(provider, message(TOKEN))


def test_apns_renews_an_expired_provider_token(folder: Path) -> None:
    """ExpiredProviderToken (a token signed over an hour ago): not processed (retried),
    and the next send signs a fresh one."""
    late = [time.time() - 2 * 3600]
    with ApnsFake(folder) as fake:
        provider = apns(fake, clock=lambda: late[0])

        async def go() -> Sent:
            try:
                with pytest.raises(TransientFailure, match="ExpiredProviderToken"):
                    await provider.send(message(TOKEN))
                late[0] = time.time()
                return await provider.send(message(TOKEN))
            finally:
                await provider.aclose()

        assert asyncio.run(go()).provider_message_id
    assert len(set(fake.tokens_seen)) == 2


# -- FCM ------------------------------------------------------------------------------


def test_fcm_gets_a_token_from_the_oauth_endpoint_and_collapses() -> None:
    """google-auth trades the account's signed assertion for a token at the fake's
    token endpoint once; both sends carry the collapse key, tag and apns-collapse-id,
    and the device shows one."""
    with FcmFake() as fake:
        provider = fcm(fake)

        async def twice() -> list[Sent]:
            try:
                return [await provider.send(message(FCM_TOKEN)) for _ in range(2)]
            finally:
                await provider.aclose()

        sent = asyncio.run(twice())
    assert fake.grants == 1
    assert [s.provider_message_id for s in sent] == [
        "projects/kirim-test/messages/1",
        "projects/kirim-test/messages/2",
    ]
    cid = collapse_id("k-1")
    m = fake.messages[0]
    assert m["android"] == {"collapse_key": cid, "notification": {"tag": cid}}
    assert m["apns"]["headers"]["apns-collapse-id"] == cid
    assert fake.duplicated() == 0


@pytest.mark.parametrize(
    ("setup", "kind", "code"),
    [
        ("dead", DeadAddress, "UNREGISTERED"),
        ("quota", TransientFailure, "QUOTA_EXCEEDED"),
        ("unavailable", AmbiguousFailure, "UNAVAILABLE"),
        ("lost", AmbiguousFailure, "no answer"),
        ("invalid", NotSent, "registration token"),
        ("bad_account", NotSent, "no OAuth token"),
    ],
)
def test_fcm_classifies_its_documented_errors(
    setup: str, kind: type[ProviderError], code: str
) -> None:
    """UNREGISTERED retires, QUOTA_EXCEEDED is retried with its Retry-After,
    UNAVAILABLE and a lost answer are ambiguous, a token that cannot be one and an
    account the token endpoint refuses never reach FCM."""
    rates = {
        "quota": {"limit_rate": ALWAYS},
        "unavailable": {"error_rate": ALWAYS},
        "lost": {"lost_rate": ALWAYS},
    }.get(setup, {})
    with FcmFake(behaviour=faults(**rates)) as fake:
        provider = fcm(fake)
        m = message(FCM_TOKEN if setup != "invalid" else "x")
        if setup == "dead":
            fake.dead.add(FCM_TOKEN)
        if setup == "bad_account":
            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            pem = key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ).decode()
            account = {**fake.account, "private_key": pem}
            provider = FcmProvider(account=account, url=fake.url, timeout=1.0)
        with pytest.raises(kind, match=code) as raised:
            send(provider, m)
    if setup == "quota":
        assert isinstance(raised.value, TransientFailure)
        assert raised.value.retry_after == 1.0
    if setup in ("invalid", "bad_account"):
        assert fake.messages == []


# -- Web Push --------------------------------------------------------------------------


def test_webpush_message_is_decrypted_by_the_service_with_the_subscriptions_keys() -> None:
    """The fake decrypts the body with the subscription's private key and auth secret
    (RFC 8291) and checks the VAPID signature; the message carries the tag, the
    request the Topic; two sends show once."""
    with WebPushFake() as fake:
        sub = fake.subscribe()
        first = send(webpush(), message(sub))
        send(webpush(), message(sub))
    assert first.provider_message_id
    assert first.provider_message_id.endswith("/message/1")
    _device, shown = fake.shown[0]
    assert shown == {"title": "Shipped", "body": "Order 7", "tag": collapse_id("k-1")}
    assert fake.topics == [collapse_id("k-1")] * 2
    assert fake.subjects == ["mailto:ops@example.com"] * 2
    assert fake.duplicated() == 0
    assert not fake.refused


@pytest.mark.parametrize(
    ("setup", "kind"),
    [
        ("gone", DeadAddress),
        ("wrong_keys", PermanentFailure),
        ("limited", TransientFailure),
        ("lost", AmbiguousFailure),
        ("not_json", NotSent),
    ],
)
def test_webpush_classifies_the_services_answers(setup: str, kind: type[ProviderError]) -> None:
    """410 retires the subscription, a body the service cannot decrypt is refused for
    good, 429 is retried, a lost answer is ambiguous, a bad subscription never leaves."""
    rates = {"limited": {"limit_rate": ALWAYS}, "lost": {"lost_rate": ALWAYS}}.get(setup, {})
    with WebPushFake(behaviour=faults(**rates)) as fake:
        sub = fake.subscribe()
        if setup == "gone":
            fake.kill(sub)
        if setup == "wrong_keys":  # another browser's keys on this endpoint
            other = json.loads(fake.subscribe())
            sub = json.dumps({"endpoint": json.loads(sub)["endpoint"], "keys": other["keys"]})
        with pytest.raises(kind):
            send(webpush(), message("{not json" if setup == "not_json" else sub))
    if setup == "wrong_keys":
        assert fake.refused["decrypt"] == 1
        assert fake.shown == []


# -- Twilio and Slack ---------------------------------------------------------------


def test_twilio_sends_and_a_resend_is_a_second_sms() -> None:
    """Twilio keeps no key: 201 with the SID each time, and the phone has two."""
    with TwilioFake() as fake:
        first = send(twilio(fake), message(PHONE, payload={"body": "Order 7"}))
        send(twilio(fake), message(PHONE, payload={"body": "Order 7"}))
    assert (first.provider_message_id or "").startswith("SM")
    assert fake.duplicated() == 1


@pytest.mark.parametrize(
    ("setup", "kind", "code"),
    [
        ("auth", PermanentFailure, "20003"),
        ("stop", PermanentFailure, "21610"),
        ("limited", TransientFailure, "20429"),
        ("server", AmbiguousFailure, "20500"),
        ("lost", AmbiguousFailure, "no answer"),
        ("bad_phone", NotSent, "E.164"),
    ],
)
def test_twilio_classifies_its_error_codes(
    setup: str, kind: type[ProviderError], code: str
) -> None:
    """Twilio's documented errors keep their class; a number that is not E.164 never
    leaves."""
    rates = {
        "limited": {"limit_rate": ALWAYS},
        "server": {"error_rate": ALWAYS},
        "lost": {"lost_rate": ALWAYS},
    }.get(setup, {})
    with TwilioFake(behaviour=faults(**rates)) as fake:
        if setup == "stop":
            fake.dead.add(PHONE)
        provider = twilio(fake, auth_token="wrong") if setup == "auth" else twilio(fake)
        with pytest.raises(kind, match=code):
            send(provider, message("555" if setup == "bad_phone" else PHONE, payload={"body": "x"}))


def test_slack_posts_with_the_key_in_metadata_and_finds_it_again() -> None:
    """chat.postMessage answers the ts; lookup finds the key in the channel's history,
    and answers None for a key never posted."""
    with SlackFake() as fake:
        provider = slack(fake, channel="C0KIRIM01")

        async def go() -> tuple[Sent, Sent | None, Sent | None]:
            try:
                sent = await provider.send(message("C0KIRIM01", payload={"body": "Order 7"}))
                return sent, await provider.lookup("k-1"), await provider.lookup("k-2")
            finally:
                await provider.aclose()

        sent, found, missing = asyncio.run(go())
    assert found == sent
    assert missing is None


@pytest.mark.parametrize(
    ("setup", "kind"),
    [
        ("auth", PermanentFailure),
        ("unknown", PermanentFailure),
        ("limited", TransientFailure),
        ("internal", AmbiguousFailure),
    ],
)
def test_slack_classifies_its_errors(setup: str, kind: type[ProviderError]) -> None:
    """invalid_auth and channel_not_found are permanent, ratelimited is retried,
    internal_error ambiguous."""
    rates = {"limited": {"limit_rate": ALWAYS}, "internal": {"error_rate": ALWAYS}}.get(setup, {})
    with SlackFake(behaviour=faults(**rates)) as fake:
        provider = slack(fake, token="xoxb-wrong") if setup == "auth" else slack(fake)
        with pytest.raises(kind):
            send(
                provider,
                message("C0NOSUCH1" if setup == "unknown" else "C0KIRIM01", payload={"body": "x"}),
            )


# -- credentials ----------------------------------------------------------------------


def test_no_credential_in_a_repr_or_an_error(folder: Path) -> None:
    """The keys, tokens and auth tokens never appear in a provider's repr, nor in the
    errors of a refused request."""
    with ApnsFake(folder) as a, FcmFake() as f, TwilioFake() as t, SlackFake() as s:
        a.dead.add(TOKEN)
        f.dead.add(FCM_TOKEN)
        providers = [
            apns(a),
            fcm(f),
            webpush(),
            twilio(t, auth_token="s3cr3t-twilio"),
            slack(s, token="xoxb-s3cr3t"),
        ]
        secrets = [
            a.private_key,
            f.account["private_key"],
            VAPID_PEM,
            "s3cr3t-twilio",
            "xoxb-s3cr3t",
            t.auth_token,
        ]
        said = [repr(p) for p in providers]
        for provider, to in zip(
            providers, [TOKEN, FCM_TOKEN, "{}", PHONE, "C0KIRIM01"], strict=True
        ):
            with pytest.raises(ProviderError) as raised:
                send(
                    provider,
                    message(to, payload={"body": "x"} if to in (PHONE, "C0KIRIM01") else None),
                )
            said.append(str(raised.value))
    pieces = [line for secret in secrets for line in secret.strip().splitlines()[1:2] or [secret]]
    for text in said:
        for piece in pieces:
            assert piece not in text
