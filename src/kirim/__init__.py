"""kirim: notification delivery that never sends the same notification twice."""

from kirim.channels import Channel
from kirim.config import Config, load_config
from kirim.engine import Kirim, Notification, NotifyRequest
from kirim.errors import (
    AmbiguousFailure,
    ConfigError,
    IdempotencyKeyReused,
    InvalidNotification,
    KirimError,
    NotFound,
    PayloadTooLarge,
    PermanentFailure,
    ProviderError,
    SchemaError,
    StoreError,
    TransientFailure,
    UnknownChannel,
)
from kirim.inbox import FeedCounts, FeedItem, FeedPage
from kirim.keys import default_key
from kirim.model import (
    Attempt,
    AttemptStatus,
    Delivery,
    DeliveryStatus,
    Doubt,
    Job,
    JobStatus,
    OnUnknown,
)
from kirim.notify import EventResult, NotificationType, Recipient, RenderError
from kirim.preferences import Preferences, Window
from kirim.providers import Message, Provider, Reconcilable, Sent
from kirim.providers.inbox import InboxProvider
from kirim.providers.webhook import WebhookProvider
from kirim.sync import SyncKirim
from kirim.version import __version__
from kirim.worker import Worker, WorkerSettings

__all__ = [
    "AmbiguousFailure",
    "Attempt",
    "AttemptStatus",
    "Channel",
    "Config",
    "ConfigError",
    "Delivery",
    "DeliveryStatus",
    "Doubt",
    "EventResult",
    "FeedCounts",
    "FeedItem",
    "FeedPage",
    "IdempotencyKeyReused",
    "InboxProvider",
    "InvalidNotification",
    "Job",
    "JobStatus",
    "Kirim",
    "KirimError",
    "Message",
    "NotFound",
    "Notification",
    "NotificationType",
    "NotifyRequest",
    "OnUnknown",
    "PayloadTooLarge",
    "PermanentFailure",
    "Preferences",
    "Provider",
    "ProviderError",
    "Recipient",
    "Reconcilable",
    "RenderError",
    "SchemaError",
    "Sent",
    "StoreError",
    "SyncKirim",
    "TransientFailure",
    "UnknownChannel",
    "WebhookProvider",
    "Window",
    "Worker",
    "WorkerSettings",
    "__version__",
    "default_key",
    "load_config",
]
