"""``provider = "inbox"``: the in-app inbox, a feed per recipient in kirim's own
database (``kirim.inbox``).

No request leaves the host. ``send`` only renders the message: the payload's
``title``, ``body``, ``action_url`` and ``data`` (a notification type's ``inbox``
template parts; a ``subject`` stands in for a missing title, a payload that is text
is the body). The worker's finish writes it into the recipient's feed in the same
transaction that marks the delivery sent, once per recipient and idempotency key
(``kirim.store.feed``). So a crash before that commit wrote nothing, and the retry
writes it once: the provider is idempotent by construction, and a delivery of it is
never in doubt.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kirim.errors import PermanentFailure
from kirim.inbox import FeedMessage
from kirim.providers.base import Message, Sent

#: the payload's keys the feed keeps
PARTS = ("title", "body", "action_url", "data")
#: the keys of a channel's table it takes besides the common ones: none
KEYS: frozenset[str] = frozenset()


def check_options(options: Mapping[str, Any]) -> str | None:
    """What is wrong with an inbox channel's options, or None."""
    if options.get("lookup"):
        return "lookup: the inbox provider has no lookup"
    if options.get("idempotent") is False:
        return (
            "idempotent: an inbox channel is idempotent by construction "
            "(its message is written once per key, in the commit that marks it sent)"
        )
    return None


def from_table(options: Mapping[str, Any]) -> InboxProvider:
    """The provider of a checked ``[channels.NAME]`` table (it takes no options)."""
    return InboxProvider()


class InboxProvider:
    """Renders a delivery into its recipient's feed message (written by the finish)."""

    #: sending again with the same key cannot write a second message (the feed's
    #: UNIQUE (recipient_id, idempotency_key)), and nothing written is ever in doubt
    idempotent = True
    #: what ``kirim doctor`` and the docs call it
    kind = "inbox"
    #: the message is written in the finish's own commit (``Channel.in_commit``): an
    #: attempt whose outcome never committed wrote nothing, so it is never in doubt
    writes_in_commit = True

    def __init__(self, **_: Any) -> None:
        return None

    async def send(self, message: Message) -> Sent:
        return Sent(provider_message_id=f"feed:{message.delivery_id}", feed=feed_message(message))


def feed_message(message: Message) -> FeedMessage:
    """The feed message of ``message``; ``PermanentFailure`` when its payload cannot be
    one (a part of the wrong kind)."""
    payload = message.payload
    parts: Mapping[str, Any]
    if isinstance(payload, Mapping):
        parts = payload
    elif isinstance(payload, str):
        parts = {"body": payload}
    else:
        parts = {"body": json.dumps(payload)}
    title = parts.get("title", parts.get("subject"))
    texts = {"title": title, "body": parts.get("body"), "action_url": parts.get("action_url")}
    for name, value in texts.items():
        if value is not None and not isinstance(value, str):
            raise PermanentFailure(f"the inbox message's {name} must be text")
    return FeedMessage(
        recipient_id=message.recipient_id or message.recipient,
        idempotency_key=message.idempotency_key,
        delivery_id=message.delivery_id,
        type=message.type,
        title=texts["title"],
        body=texts["body"],
        action_url=texts["action_url"],
        data=parts.get("data"),
    )
