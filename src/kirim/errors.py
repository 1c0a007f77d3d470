"""kirim's exceptions. Every error kirim raises on purpose is a ``KirimError``::

KirimError
├── InvalidNotification        bad input to notify(); nothing was written
│   ├── UnknownChannel
│   └── PayloadTooLarge
├── IdempotencyKeyReused       same key, another event, recipient, channel or payload
├── ConfigError                a kirim.toml or URL that cannot be used
├── StoreError                 the database said no
│   └── SchemaError            not initialised, or newer than this code
├── NotFound                   no delivery with that key or id
├── NotSettled                 an earlier request may still land; try again at retry_at
├── ActionRefused              an operator action does not apply to the delivery's state
└── ProviderError              raised by providers, classified at the seam
    ├── PermanentFailure       the provider refused; never retry
    │   ├── NotSent            failed before any byte left this host; never retry
    │   └── DeadAddress        the service says the address is gone: retire it
    ├── TransientFailure       certainly not processed; safe to retry
    └── AmbiguousFailure       may have been processed; in-doubt policy
"""

from __future__ import annotations


class KirimError(Exception):
    """Root of every error kirim raises on purpose."""


class InvalidNotification(KirimError):
    """The notification cannot be accepted as given; nothing was written."""


class UnknownChannel(InvalidNotification):
    """The channel is not configured."""


class PayloadTooLarge(InvalidNotification):
    """The payload's JSON encoding is over the configured limit."""


class IdempotencyKeyReused(KirimError):
    """The idempotency key already names a delivery of another notification.

    ``field`` names the first difference found: ``event_id``, ``recipient``,
    ``channel`` or ``payload``, compared in that order.
    """

    def __init__(self, key: str, delivery_id: int, field: str = "payload") -> None:
        super().__init__(
            f"idempotency key {key!r} already belongs to delivery {delivery_id} "
            f"with a different {field}; use a new key for a new notification"
        )
        self.key = key
        self.delivery_id = delivery_id
        self.field = field


class ConfigError(KirimError):
    """The configuration cannot be used."""


class StoreError(KirimError):
    """The store failed."""


class SchemaError(StoreError):
    """The database schema is missing or newer than this version of kirim."""


class NotFound(KirimError):
    """No record matches."""


class NotSettled(KirimError):
    """An operator action must wait: an earlier request of the delivery may still land.

    ``retry_at`` is the store time (epoch seconds) after which no earlier request can
    still reach the provider; the action can be tried again then.
    """

    def __init__(self, delivery_id: int, retry_at: float, action: str) -> None:
        super().__init__(
            f"cannot {action} delivery {delivery_id} yet: an earlier request may still "
            f"reach the provider until {retry_at:.3f} (epoch seconds); try again then"
        )
        self.delivery_id = delivery_id
        self.retry_at = retry_at
        self.action = action


class ActionRefused(KirimError):
    """An operator action (cancel, retry) does not apply to the delivery as it is.

    ``code`` is ``not_dead_lettered`` or ``not_cancelable`` (the HTTP API's error code);
    the message says the delivery's state.
    """

    def __init__(self, delivery_id: int, code: str, reason: str) -> None:
        super().__init__(reason)
        self.delivery_id = delivery_id
        self.code = code


class ProviderError(KirimError):
    """A provider call failed; the subclass says whether it may have been processed."""

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class PermanentFailure(ProviderError):
    """The provider refused the request for good (4xx other than 408 and 429)."""


class NotSent(PermanentFailure):
    """The request failed before any byte of it left this host (it could not be built:
    a header that cannot be encoded, a body that cannot be serialised). Certainly not
    sent, and sending again would fail the same way."""


class DeadAddress(PermanentFailure):
    """The service says the recipient's address is gone for good: a device token it
    unregistered (APNs 410 ``Unregistered``, FCM ``UNREGISTERED``), a Web Push
    subscription that expired (404/410). The request was refused; the worker retires
    the address (``Store.retire_address``), so no later delivery uses it."""

    def __init__(self, message: str, *, address: str, status_code: int | None = None) -> None:
        super().__init__(message, status_code=status_code)
        self.address = address


class TransientFailure(ProviderError):
    """The request certainly was not processed (connection refused, 408, 429)."""

    def __init__(
        self, message: str, *, status_code: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message, status_code=status_code)
        self.retry_after = retry_after


class AmbiguousFailure(ProviderError):
    """The request may have been processed (timeout or 5xx after it was written)."""
