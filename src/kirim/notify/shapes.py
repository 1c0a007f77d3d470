"""The service parts of a type's templates: ``apns``, ``fcm``, ``webpush``, ``slack``
and the inbox's ``data`` (JSON) and ``sms`` (text), and the counting of an SMS's
segments.

A JSON part is a JSON document whose strings are templates::

    [types.order_shipped.templates.push]
    title = "Order {{ order_id }} shipped"
    apns = '{"aps": {"sound": "default", "thread-id": "orders"}}'
    fcm = '{"android": {"priority": "high"}}'

    [types.order_shipped.templates.chat]
    slack = '''[{"type": "section",
                "text": {"type": "mrkdwn", "text": "*Order {{ order_id }}* shipped"}}]'''

The document is parsed when the type is made (a syntax error is a ``ConfigError``),
then each string in it is rendered as a template of its own, so no value of the data
can break the JSON or add a key to it. The service's provider merges the part into
its request (``kirim.providers.shaping``): ``apns`` into the APNs payload, ``fcm``
into the FCM message, ``webpush`` into the notification the service worker shows,
``slack`` as the Block Kit ``blocks`` (a list of blocks, or ``{"blocks": [...]}``).

An SMS is sent in segments: GSM-7 text (the GSM 03.38 alphabet; ``€``, ``[``, ``{``
and a few more take two of its septets) fits 160 septets in one message, 153 per
segment when split; any other character makes the whole text UCS-2: 70 UTF-16 units
in one, 67 per segment. ``kirim render`` shows the count and warns past
``SMS_WARN_SEGMENTS``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

#: the parts whose source is a JSON document of templates
JSON_PARTS = ("apns", "fcm", "webpush", "slack", "data")
#: more segments than this and ``kirim render`` warns (each segment is billed)
SMS_WARN_SEGMENTS = 3

_GSM7_BASIC = (
    "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞ\x1bÆæßÉ !\"#¤%&'()*+,-./0123456789:;<=>?"
    "¡ABCDEFGHIJKLMNOPQRSTUVWXYZÄÖÑÜ§¿abcdefghijklmnopqrstuvwxyzäöñüà"
)
_GSM7_EXTENDED = "^{}\\[~]|€\f"
_BASIC = frozenset(_GSM7_BASIC) - {"\x1b"}
_EXTENDED = frozenset(_GSM7_EXTENDED)


def check_json_part(source: str, check: Callable[[str], str | None]) -> str | None:
    """Why a JSON part's source cannot be used (not JSON, or a string in it that does
    not compile: ``check``), or None."""
    try:
        document = json.loads(source)
    except ValueError as exc:
        return f"not a JSON document: {exc}"
    for text in _strings(document):
        if (problem := check(text)) is not None:
            return f"in {json.dumps(text)[:60]}: {problem}"
    return None


def render_json_part(source: str, render: Callable[[str], str]) -> Any:
    """The document of a JSON part with each of its strings (keys too) rendered."""
    return _rendered(json.loads(source), render)


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *_strings(v))]
    return []


def _rendered(value: Any, render: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return render(value)
    if isinstance(value, list):
        return [_rendered(v, render) for v in value]
    if isinstance(value, dict):
        return {render(k): _rendered(v, render) for k, v in value.items()}
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class Segments:
    """How an SMS text is sent: its encoding, its length in that encoding's units
    (septets or UTF-16 code units) and the number of segments."""

    encoding: str  # "GSM-7" or "UCS-2"
    units: int
    segments: int

    def to_json(self) -> dict[str, Any]:
        return {"encoding": self.encoding, "units": self.units, "segments": self.segments}

    @property
    def warning(self) -> str | None:
        """What ``kirim render`` says of a long text, or None."""
        if self.segments <= SMS_WARN_SEGMENTS:
            return None
        return (
            f"the SMS is {self.segments} segments ({self.units} {self.encoding} units): "
            f"each is billed; past {SMS_WARN_SEGMENTS} consider a shorter text"
        )


def segments(text: str) -> Segments:
    """The encoding and segment count of an SMS of ``text`` (GSM 03.38, 3GPP 23.040)."""
    if all(c in _BASIC or c in _EXTENDED for c in text):
        units = sum(2 if c in _EXTENDED else 1 for c in text)
        single, multi, encoding = 160, 153, "GSM-7"
    else:
        units = len(text.encode("utf-16-le")) // 2
        single, multi, encoding = 70, 67, "UCS-2"
    count = 1 if units <= single else -(-units // multi)
    return Segments(encoding=encoding, units=units, segments=count if text else 0)


def sms_of(payload: Mapping[str, Any]) -> str | None:
    """The text of an SMS payload: its ``sms`` part, else ``body``, else ``text``."""
    for part in ("sms", "body", "text"):
        value = payload.get(part)
        if isinstance(value, str):
            return value
    return None
