"""Each service's request made from a delivery's payload.

A payload rendered from a type's templates has ``title`` and ``body`` (and the
services' own parts, ``kirim.notify.shapes``); a payload given to ``notify`` may have
the same keys, or, for APNs, be a whole APNs payload already (it has ``aps``). Extra
data for the app goes in ``data`` (a JSON object; FCM's values are made text, as its
API requires). The collapse id (``kirim.providers.exchange.collapse_id``) is set
last, over anything the payload says: it is what makes a resend replace instead of
double, so a template cannot turn it off.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from kirim.notify.shapes import sms_of


def merged(base: dict[str, Any], more: Any) -> dict[str, Any]:
    """``base`` with ``more`` (a mapping) merged in, mappings key by key (deeply)."""
    out = copy.deepcopy(base)
    if not isinstance(more, Mapping):
        return out
    for key, value in more.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _payload(payload: Any) -> Mapping[str, Any]:
    if not isinstance(payload, Mapping):
        raise ValueError("the payload must be a JSON object with title and body")
    return payload


def _alert(p: Mapping[str, Any]) -> dict[str, str]:
    return {k: p[k] for k in ("title", "body") if isinstance(p.get(k), str)}


def _data(p: Mapping[str, Any]) -> dict[str, Any]:
    data = p.get("data", {})
    if not isinstance(data, Mapping):
        raise ValueError("the payload's data must be a JSON object")
    return dict(data)


def apns_payload(payload: Any) -> dict[str, Any]:
    """The APNs JSON payload: ``{"aps": {"alert": {title, body}}, **data}`` and the
    ``apns`` part merged in; a payload that has ``aps`` is taken as it is."""
    p = _payload(payload)
    if "aps" in p:
        return dict(p)
    alert = _alert(p)
    base: dict[str, Any] = {**_data(p), "aps": {"alert": alert} if alert else {}}
    body = merged(base, p.get("apns"))
    if not body["aps"]:
        raise ValueError("the APNs payload has no alert (title or body) and no aps part")
    return body


def fcm_message(payload: Any, token: str, collapse: str) -> dict[str, Any]:
    """The FCM v1 ``message``: the token, the notification (title, body), ``data`` as
    text values, the ``fcm`` part merged in, then the collapse key and the Android
    notification's tag, the ``apns-collapse-id`` for iOS and the ``Topic`` for web."""
    p = _payload(payload)
    data = {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in _data(p).items()}
    base: dict[str, Any] = {"token": token}
    if alert := _alert(p):
        base["notification"] = alert
    if data:
        base["data"] = data
    message = merged(base, p.get("fcm"))
    message["token"] = token
    forced: dict[str, dict[str, Any]] = {
        "android": {"collapse_key": collapse, "notification": {"tag": collapse}},
        "apns": {"headers": {"apns-collapse-id": collapse}},
        "webpush": {"headers": {"Topic": collapse}},
    }
    if "notification" not in message and not (message.get("android") or {}).get("notification"):
        forced["android"].pop("notification")  # a data message: no notification to tag
    return merged(message, forced)


def webpush_message(payload: Any, collapse: str) -> dict[str, Any]:
    """What the service worker receives (and shows with ``showNotification``): title,
    body, data, the ``webpush`` part, and ``tag``: the collapse id (a notification
    with the tag of a shown one replaces it)."""
    p = _payload(payload)
    base: dict[str, Any] = {**_alert(p)}
    if data := _data(p):
        base["data"] = data
    message = merged(base, p.get("webpush"))
    message["tag"] = collapse
    if not (message.get("title") or message.get("body")):
        raise ValueError("the web push payload has no title or body")
    return message


def sms_body(payload: Any) -> str:
    """The SMS text: the ``sms`` part, else ``body``, else ``text``."""
    text = sms_of(_payload(payload))
    if not text:
        raise ValueError("the payload has no sms, body or text for an SMS")
    return text


def slack_message(payload: Any) -> dict[str, Any]:
    """``text`` (the fallback notifications show: title and body) and ``blocks`` (the
    ``slack`` part: a list of Block Kit blocks, or ``{"blocks": [...]}``)."""
    p = _payload(payload)
    text = "\n".join(v for v in _alert(p).values() if v) or str(p.get("text") or "")
    out: dict[str, Any] = {"text": text}
    part = p.get("slack")
    blocks = part.get("blocks") if isinstance(part, Mapping) else part
    if blocks is not None:
        if not isinstance(blocks, list):
            raise ValueError("the slack part must be a list of Block Kit blocks")
        out["blocks"] = blocks
    if not text and "blocks" not in out:
        raise ValueError("the Slack message has no text and no blocks")
    return out
