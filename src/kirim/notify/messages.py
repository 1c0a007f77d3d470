"""A type's messages: its templates rendered for one channel, a preview, a digest.

The payload of a message is ``{"type": T, "locale": L, <part>: text, ...}`` with the
parts the channel's templates have (``subject``, ``title``, ``body``, ``html``, ``sms``,
and the services' JSON parts ``apns``, ``fcm``, ``webpush``, ``slack``, each a JSON
value: ``kirim.notify.shapes``), each
from the most specific variant of the recipient's locale that has it, else the
type's default locale; ``L`` is the locale it is written in. Templates see the
event's data and ``kirim`` = {type, channel, locale, recipient}. A digest's
templates see ``events`` (each event's data, oldest first) and ``count``; its payload
also has ``digest`` (the stream), ``count`` and ``events`` (the events' ids).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from kirim.errors import InvalidNotification, PayloadTooLarge, UnknownChannel
from kirim.keys import canonical_json
from kirim.model import Delivery
from kirim.notify.shapes import JSON_PARTS, render_json_part
from kirim.notify.templates import (
    PARTS,
    RESERVED,
    fallbacks,
    formatting_locale,
    normalize_locale,
    render,
)
from kirim.notify.types import NotificationType
from kirim.runs import RenderGathered, Run
from kirim.store.base import Compose
from kirim.validation import BadValue, check_payload

#: the data a preview may be given (no payload limit applies to it)
_PREVIEW_BYTES = 2**30


def check_data(data: Any, *, max_bytes: int) -> str:
    """The event's data (a JSON object) as canonical JSON text; InvalidNotification."""
    if not isinstance(data, Mapping) or not all(isinstance(k, str) for k in data):
        raise InvalidNotification("data must be a JSON object (a mapping of names to values)")
    if RESERVED in data:
        raise InvalidNotification(f"data must not have a field {RESERVED!r} (templates' own)")
    try:
        text = canonical_json(data)
        check_payload(data)
    except BadValue as exc:
        raise InvalidNotification(str(exc).replace("payload", "data", 1)) from None
    except (TypeError, ValueError) as exc:
        raise InvalidNotification(f"data is not JSON: {exc}") from None
    except RecursionError:
        raise InvalidNotification("data is not JSON: nested too deeply") from None
    if len(text.encode()) > max_bytes:
        raise PayloadTooLarge(f"data is {len(text.encode())} bytes, over the limit of {max_bytes}")
    return text


def render_channel(
    ntype: NotificationType,
    channel: str,
    data: Mapping[str, Any],
    *,
    locale: str | None,
    recipient: str,
) -> dict[str, Any]:
    """The payload of ``channel``'s message: each part from the most specific variant
    of ``locale`` that has it (then the default locale's). ``RenderError``."""
    templates = ntype.templates[channel]
    chain = fallbacks(locale, ntype.default_locale)
    written = next((lc for lc in chain if lc in templates.locales), ntype.default_locale)
    context = {
        **data,
        RESERVED: {
            "type": ntype.name,
            "channel": channel,
            "locale": written,
            "format_locale": formatting_locale(locale, written),
            "recipient": recipient,
        },
    }
    payload: dict[str, Any] = {"type": ntype.name, "locale": written}
    for part in PARTS:
        if part not in templates.parts:
            continue
        source, where = templates.parts[part], f"types.{ntype.name}.templates.{channel}.{part}"
        for lc in chain:
            variant = templates.locales.get(lc, {})
            if part in variant:
                source = variant[part]
                where = f"types.{ntype.name}.templates.{channel}.{lc}.{part}"
                break
        if part in JSON_PARTS:
            payload[part] = render_json_part(
                source, functools.partial(render, context=context, html=False, where=where)
            )
        else:
            payload[part] = render(source, context, html=part == "html", where=where)
    return payload


def digest_context(events: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What a digest's templates see: ``events`` (each event's data) and ``count``."""
    return {"events": [dict(e) for e in events], "count": len(events)}


def preview(
    ntype: NotificationType,
    data: Any,
    *,
    locale: str | None = None,
    channel: str | None = None,
    recipient: str = "preview",
) -> dict[str, dict[str, Any]]:
    """Each channel's payload (or ``channel``'s) for ``data``, as ``notify_event``
    renders it; a digest type's ``data`` is one event's data or a list of them."""
    if channel is not None and channel not in ntype.channels:
        raise UnknownChannel(
            f"type {ntype.name!r} has no channel {channel!r} (its channels: "
            f"{', '.join(ntype.channels)})"
        )
    try:
        asked = None if locale is None else normalize_locale(locale)
    except ValueError as exc:
        raise InvalidNotification(f"locale: {exc}") from None
    if ntype.digest is not None:
        events = data if isinstance(data, list) else [data]
        for e in events:
            check_data(e, max_bytes=_PREVIEW_BYTES)
        shown = digest_context(events)
    else:
        check_data(data, max_bytes=_PREVIEW_BYTES)
        shown = data
    channels = ntype.channels if channel is None else (channel,)
    return {
        ch: render_channel(ntype, ch, shown, locale=asked, recipient=recipient) for ch in channels
    }


def compose_digest(
    ntype: NotificationType, delivery: Delivery, events: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """A sealed digest's payload: the templates of the delivery's channel rendered with
    ``events`` (as the store gives them, oldest first: ``{"event_id", "data", "at"}``;
    the templates see each one's data) and ``count``, in the locale its first event
    asked for; ``events`` in the payload lists their ids."""
    placeholder = delivery.payload if isinstance(delivery.payload, Mapping) else {}
    asked = placeholder.get("locale")
    payload = render_channel(
        ntype,
        delivery.channel,
        digest_context([e["data"] for e in events]),
        locale=asked if isinstance(asked, str) else None,
        recipient=delivery.recipient_id or delivery.recipient,
    )
    payload["digest"] = placeholder.get("digest")
    payload["count"] = len(events)
    payload["events"] = [e["event_id"] for e in events]
    return payload


def render_gathered(
    types: Mapping[str, NotificationType],
    max_payload_bytes: int,
    run: Run,
    channel: str,
    message: Mapping[str, str],
    events: Sequence[Mapping[str, Any]],
) -> str | None:
    """A digest step's holder's later send (``kirim.runs.RenderGathered``): the
    channel's templates rendered with the run's data, ``events`` (the window's events'
    data, oldest first) and ``count``, in the locale the event asked for; the payload
    also has ``count`` and ``events`` (the events' ids). None: an unknown type."""
    ntype = types.get(run.type)
    if ntype is None or channel not in ntype.templates:
        return None
    locale = message.get("locale") or None
    context = {**run.data, **digest_context([e["data"] for e in events])}
    payload = render_channel(ntype, channel, context, locale=locale, recipient=run.recipient_id)
    payload["count"] = len(events)
    payload["events"] = [e["event_id"] for e in events]
    text = canonical_json(payload)
    if len(text) > max_payload_bytes:
        raise PayloadTooLarge(
            f"the digest of {len(events)} events renders {len(text)} bytes, over the "
            f"limit of {max_payload_bytes}"
        )
    return text


def run_renderer(types: Mapping[str, NotificationType], max_payload_bytes: int) -> RenderGathered:
    """``render_gathered`` for these types: what the worker advances runs with."""
    return functools.partial(render_gathered, dict(types), max_payload_bytes)


def composer(ntype: NotificationType) -> Compose:
    """``compose_digest`` for one type: what the worker seals its digests with."""
    return functools.partial(compose_digest, ntype)


def composers(types: Mapping[str, NotificationType]) -> dict[str, Compose]:
    """Type name -> compose, for the digest types among ``types``."""
    return {name: composer(t) for name, t in types.items() if t.digest is not None}
