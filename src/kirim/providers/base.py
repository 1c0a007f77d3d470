"""The provider seam: one method, ``send``, with failures classified right here.

A provider raises ``PermanentFailure`` (refused for good), ``TransientFailure``
(certainly not processed) or ``AmbiguousFailure`` (may have been processed);
anything else it raises is treated as ambiguous, because kirim cannot know. Where a
failure happened decides its class: before any byte left the host (building the
request, encoding a header) it is ``NotSent``; after, ambiguous unless the provider's
answer says otherwise. A provider draws that line where it hands the request to its
transport, as ``WebhookProvider.send`` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from kirim.frozen import quick_init
from kirim.inbox import FeedMessage


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """What a provider is asked to deliver."""

    delivery_id: int
    idempotency_key: str
    provider_request_id: str
    event_id: str
    recipient: str
    channel: str
    payload: Any
    attempt: int
    #: the notification type (``notify_event``; None: ``notify``)
    type: str | None = None
    #: the recipient whose delivery it is (``recipient`` is the channel's address)
    recipient_id: str | None = None


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Sent:
    """The provider accepted the message."""

    provider_message_id: str | None = None
    #: the in-app inbox's message (``kirim.providers.inbox``): the worker's finish
    #: writes it into the recipient's feed in the commit that marks the delivery sent
    feed: FeedMessage | None = None


@runtime_checkable
class Provider(Protocol):
    #: True when the provider deduplicates requests by ``idempotency_key``, so that
    #: sending again with the same key can never reach the user twice.
    idempotent: bool

    async def send(self, message: Message) -> Sent: ...


@runtime_checkable
class Closable(Protocol):
    """A provider with resources to release when its app closes (optional)."""

    async def aclose(self) -> None: ...


@runtime_checkable
class Reconcilable(Protocol):
    """A provider that can say whether it already accepted a key."""

    async def lookup(self, idempotency_key: str) -> Sent | None: ...
