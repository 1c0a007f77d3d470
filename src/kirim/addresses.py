"""Recipients' addresses: where a recipient is reached on each channel.

A recipient (the id ``notify_event`` is given) has addresses per channel: an email, a
phone number (E.164), APNs or FCM device tokens, Web Push subscriptions, Slack ids.
What an address must look like is the channel's provider's ``address_kind``
(``KINDS``); a channel whose provider says none takes any text.

An event to the recipient on a channel fans out to each of its addresses there that
is not retired, one delivery each with a key of its own (``kirim.keys.device_key``),
so one bad token never blocks the others (``kirim.notify.fanout``). A recipient whose
``to`` names the channel's address goes there alone, as before; one with no address
on a channel whose provider needs one is ``suppressed`` (``no_address``); one with no
address on any other channel is sent to its id, as before.

A token the service calls dead (``DeadAddress``: APNs 410 ``Unregistered``, FCM
``UNREGISTERED``, Web Push 404/410) is retired by the worker: kept, marked with when
and why, never used again, and counted in ``kirim status``; the recipient's app
registering it again (``add``) brings it back.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kirim import limits
from kirim.validation import BadValue, check_text


@dataclass(frozen=True, slots=True, kw_only=True)
class Address:
    """One address of one recipient on one channel."""

    recipient_id: str
    channel: str
    address: str
    label: str | None = None
    added_at: float = 0.0
    #: when the service called it dead (None: in use)
    retired_at: float | None = None
    retired_reason: str | None = None

    @property
    def retired(self) -> bool:
        return self.retired_at is not None

    def to_json(self) -> dict[str, Any]:
        from kirim.views import iso

        return {
            "recipient_id": self.recipient_id,
            "channel": self.channel,
            "address": self.address,
            "label": self.label,
            "added_at": iso(self.added_at),
            "retired": self.retired,
            "retired_at": iso(self.retired_at),
            "retired_reason": self.retired_reason,
        }


def _email(address: str) -> str | None:
    local, at, domain = address.rpartition("@")
    if not at or not local or "." not in domain or any(c.isspace() for c in address):
        return "an email address is local@domain"
    return None


def _kinds() -> dict[str, Callable[[str], str | None]]:
    from kirim.providers import apns, fcm, slack, twilio, webpush

    return {
        "email": _email,
        "phone": twilio.address_problem,
        "apns": apns.address_problem,
        "fcm": fcm.address_problem,
        "webpush": webpush.address_problem,
        "slack": slack.address_problem,
    }


#: the kinds of address a provider may say it takes (its ``address_kind``)
KINDS = ("email", "phone", "apns", "fcm", "webpush", "slack")
#: the kinds whose channel has nothing to send to without an address (no fallback to
#: the recipient's id)
NEEDED = frozenset({"phone", "apns", "fcm", "webpush", "slack"})


def fallback_problem(name: str, kind: str | None, other: str, other_kind: str | None) -> str | None:
    """Why channel ``other`` cannot be a fallback of ``name``: a failover sends the
    delivery to the same address, so two channels that each take a kind of address
    must take the same one (an APNs device token is no email address). A channel that
    takes any text (a webhook: the address is passed on as it is) goes with any."""
    if kind is None or other_kind is None or kind == other_kind:
        return None
    return (
        f"channels.{name}.fallback: {other!r} takes {other_kind} addresses, {name!r} takes "
        f"{kind} addresses: a failover sends to the delivery's own address, so a fallback "
        "must take the same kind"
    )


def kind_of(provider: object) -> str | None:
    """The kind of address a provider takes (None: any text)."""
    kind = getattr(provider, "address_kind", None)
    return kind if kind in KINDS else None


def check_address(kind: str | None, address: Any) -> str:
    """``address`` as stored (a Web Push subscription in canonical JSON); BadValue
    (a ValueError) saying what is wrong."""
    text = check_text("address", address, limit=limits.RECIPIENT)
    if kind == "webpush":
        try:
            text = json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
        except ValueError:
            raise BadValue("address", "must be a Web Push subscription's JSON") from None
    if kind is not None and (problem := _kinds()[kind](text)) is not None:
        raise BadValue("address", f"is not valid: {problem}")
    return text


def check_label(label: Any) -> str | None:
    """A label (``"Ana's iPhone"``), at most 200 bytes; None for none."""
    if label is None:
        return None
    return check_text("label", label, limit=limits.CHANNEL)


__all__ = ["KINDS", "NEEDED", "Address", "check_address", "check_label", "kind_of"]
