"""``kirim simulate --channel apns|fcm|webpush|sms``: the run's service fake, its
notifications, and the channel both strategies send through.

Both strategies send through kirim's own provider of the service (the same wire
format); the naive flow gives it a fresh key on every send, as a sender without an
idempotency key does, so its resends carry a fresh collapse id and show again on the
device, where kirim's carry the delivery's own and replace. The fake counts what the
device shows (``kirim.devtools.services.base``): a notification is told apart by the
device and its text. Its faults: ``--timeout-rate`` is half answers lost after
delivery (the connection closed), half answers held past the client's timeout;
``--error-rate`` half 5xx, half 429 with ``Retry-After`` (neither delivered).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kirim.devtools.receiver import Behaviour
from kirim.devtools.services.base import ServiceFake
from kirim.keys import default_key

#: the simulate channels that are services, and the provider each uses
PROVIDERS = {"apns": "apns", "fcm": "fcm", "webpush": "webpush", "sms": "twilio"}
USERS = 97


def behaviour_of(timeout_rate: float, error_rate: float, base: Behaviour) -> Behaviour:
    """The fake's faults from the run's rates (the module's text)."""
    return Behaviour(
        hang_rate=timeout_rate / 2,
        lost_rate=timeout_rate / 2,
        hang_s=base.hang_s,
        error_rate=error_rate / 2,
        limit_rate=error_rate / 2,
        latency=base.latency,
    )


@contextlib.contextmanager
def fake_for(kind: str, behaviour: Behaviour, seed: int, folder: Path) -> Iterator[ServiceFake]:
    """The service fake of ``kind`` on 127.0.0.1 (stopped when the block ends)."""
    fake: Any
    if kind == "apns":
        from kirim.devtools.services.apns import ApnsFake

        fake = ApnsFake(folder, behaviour=behaviour, seed=seed)
    elif kind == "fcm":
        from kirim.devtools.services.fcm import FcmFake

        fake = FcmFake(behaviour=behaviour, seed=seed)
    elif kind == "webpush":
        from kirim.devtools.services.webpush import WebPushFake

        fake = WebPushFake(behaviour=behaviour, seed=seed)
    else:
        from kirim.devtools.services.twilio import TwilioFake

        fake = TwilioFake(behaviour=behaviour, seed=seed)
    with fake:
        yield fake


def _address(kind: str, user: int, fake: Any) -> str:
    digest = hashlib.sha256(f"user-{user}".encode()).hexdigest()
    if kind == "apns":
        return digest
    if kind == "fcm":
        return f"fcm-{digest[:40]}"
    if kind == "sms":
        return f"+1555{user:07d}"
    subs: dict[int, str] = fake.__dict__.setdefault("_simulate_subscriptions", {})
    if user not in subs:
        subs[user] = fake.subscribe()
    return subs[user]


def requests(n: int, kind: str, fake: Any) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(event, recipient, channel, payload) of the run: a push (an SMS) per order."""
    channel = "sms" if kind == "sms" else "push"
    out = []
    for i in range(n):
        payload: dict[str, Any] = {
            "title": "Your order shipped",
            "body": f"Order {i} is on its way.",
        }
        if kind == "sms":
            payload = {"body": f"Order {i} is on its way."}
        out.append((f"order-{i}", _address(kind, i % USERS, fake), channel, payload))
    return out


def identify(items: list[tuple[str, str, str, dict[str, Any]]], kind: str) -> Any:
    """How the fake tells notifications apart, as a user would: the device and the
    text it shows, mapped to the notification's key."""

    def device(recipient: str) -> str:
        return str(json.loads(recipient)["endpoint"]) if kind == "webpush" else recipient

    keys = {(device(r), p["body"]): default_key(e, r, c) for e, r, c, p in items}
    return lambda address, shown: keys.get((address, shown.get("body", "")), "")


def options(kind: str, fake: Any, folder: Path, timeout: float) -> dict[str, Any]:
    """The channel's ``[channels.NAME]`` table for the fake (files written to ``folder``)."""
    if kind == "apns":
        key = folder / "apns.p8"
        key.write_text(fake.private_key)
        return {
            "provider": "apns",
            "team_id": fake.team_id,
            "key_id": fake.key_id,
            "private_key_file": str(key),
            "topic": fake.topic,
            "url": fake.url,
            "ca_file": str(fake.ca_file),
            "timeout": timeout,
        }
    if kind == "fcm":
        account = folder / "fcm.json"
        account.write_text(json.dumps(fake.account))
        return {
            "provider": "fcm",
            "service_account_file": str(account),
            "url": fake.url,
            "timeout": timeout,
        }
    if kind == "webpush":
        from py_vapid import Vapid02

        vapid = Vapid02()
        vapid.generate_keys()
        key = folder / "vapid.pem"
        key.write_bytes(vapid.private_pem())
        return {
            "provider": "webpush",
            "vapid_private_key_file": str(key),
            "vapid_subject": "mailto:ops@example.com",
            "timeout": timeout,
        }
    return {
        "provider": "twilio",
        "account_sid": fake.account_sid,
        "auth_token": fake.auth_token,
        "from": fake.sender,
        "url": fake.url,
        "timeout": timeout,
    }


def toml_lines(table: dict[str, Any]) -> str:
    """``key = value`` lines of a table (strings and numbers)."""
    return "".join(f"{k} = {json.dumps(v)}\n" for k, v in table.items())
