"""The notification layer: types and their templates, and the fan-out of one event.

``notify_event(type, recipients, data, event_id=...)`` (``kirim.engine``) renders a
``NotificationType``'s templates (``templates``, ``messages``) for every recipient x
channel and plans their deliveries with the recipients' preferences, throttles and
digests (``fanout``), recorded by one ``store.enqueue``.
"""

from kirim.notify.fanout import EventDelivery, EventResult, Recipient
from kirim.notify.messages import compose_digest, composers, preview
from kirim.notify.templates import RenderError
from kirim.notify.types import (
    DigestRule,
    NotificationType,
    Templates,
    ThrottleRule,
    parse_type,
    parse_types,
)

__all__ = [
    "DigestRule",
    "EventDelivery",
    "EventResult",
    "NotificationType",
    "Recipient",
    "RenderError",
    "Templates",
    "ThrottleRule",
    "compose_digest",
    "composers",
    "parse_type",
    "parse_types",
    "preview",
]
