"""kirim's exceptions. Every error kirim raises on purpose is a ``KirimError``::

KirimError
├── InvalidNotification        bad input to notify(); nothing was written
│   ├── UnknownChannel
│   └── PayloadTooLarge
├── IdempotencyKeyReused       same key, different payload
├── ConfigError                a kirim.toml or URL that cannot be used
├── StoreError                 the database said no
│   └── SchemaError            not initialised, or newer than this code
├── NotFound                   no delivery with that key or id
└── ProviderError              raised by providers, classified at the seam
    ├── PermanentFailure       the provider refused; never retry
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
    """The idempotency key already names a delivery with a different payload."""

    def __init__(self, key: str, delivery_id: int) -> None:
        super().__init__(
            f"idempotency key {key!r} already belongs to delivery {delivery_id} "
            "with a different payload; use a new key for a new notification"
        )
        self.key = key
        self.delivery_id = delivery_id


class ConfigError(KirimError):
    """The configuration cannot be used."""


class StoreError(KirimError):
    """The store failed."""


class SchemaError(StoreError):
    """The database schema is missing or newer than this version of kirim."""


class NotFound(KirimError):
    """No record matches."""


class ProviderError(KirimError):
    """A provider call failed; the subclass says whether it may have been processed."""

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class PermanentFailure(ProviderError):
    """The provider refused the request for good (4xx other than 408 and 429)."""


class TransientFailure(ProviderError):
    """The request certainly was not processed (connection refused, 408, 429)."""

    def __init__(
        self, message: str, *, status_code: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message, status_code=status_code)
        self.retry_after = retry_after


class AmbiguousFailure(ProviderError):
    """The request may have been processed (timeout or 5xx after it was written)."""
