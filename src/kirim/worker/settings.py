"""How a worker runs: lease, concurrency, batching, polling, backoff, shutdown."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from kirim.validation import DAY, BadValue, Number

_SECONDS = "seconds"

#: every numeric setting's type and range: checked on construction (so kirim.toml too)
#: and by the worker's flags, with the same message
RULES: Mapping[str, Number] = {
    "lease": Number(minimum=0, above=True, maximum=DAY, unit=_SECONDS),
    "concurrency": Number(minimum=1, maximum=10_000, integer=True),
    "batch_size": Number(minimum=1, maximum=10_000, integer=True),
    "poll_interval": Number(minimum=0.001, maximum=3600, unit=_SECONDS),
    "heartbeat_interval": Number(minimum=0, above=True, maximum=DAY, unit=_SECONDS, optional=True),
    "reap_interval": Number(minimum=0, above=True, maximum=DAY, unit=_SECONDS, optional=True),
    "backoff_base": Number(minimum=0, maximum=DAY, unit=_SECONDS),
    "backoff_max": Number(minimum=0, maximum=30 * DAY, unit=_SECONDS),
    "shutdown_grace": Number(minimum=0, maximum=DAY, unit=_SECONDS),
    "request_timeout": Number(minimum=0, above=True, maximum=DAY, unit=_SECONDS),
    "send_margin": Number(minimum=0, maximum=DAY, unit=_SECONDS, optional=True),
    "settle_margin": Number(minimum=0, maximum=DAY, unit=_SECONDS, optional=True),
    "stats_interval": Number(minimum=0, above=True, maximum=DAY, unit=_SECONDS),
    "retention_keep": Number(
        minimum=0, above=True, maximum=100 * 365 * DAY, unit=_SECONDS, optional=True
    ),
    "retention_keys": Number(minimum=0, maximum=100 * 365 * DAY, unit=_SECONDS),
    "retention_archived": Number(
        minimum=0, above=True, maximum=100 * 365 * DAY, unit=_SECONDS, optional=True
    ),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSettings:
    lease: float = 30.0
    concurrency: int = 10
    batch_size: int = 100
    poll_interval: float = 1.0
    heartbeat_interval: float | None = None  # default: lease / 3
    reap_interval: float | None = None  # default: min(lease / 2, 5)
    backoff_base: float = 1.0
    backoff_max: float = 300.0
    shutdown_grace: float = 10.0
    #: the longest a provider request may take when its provider names no ``timeout``:
    #: the worker stops waiting then (the outcome is unknown)
    request_timeout: float = 30.0
    #: how long before the claim's lease would end its request may no longer leave
    #: (default: a fifth of the lease); covers clock-rate drift between hosts
    send_margin: float | None = None
    #: added to an attempt's settle bound (default: one lease): allowance for a worker
    #: frozen between its deadline check and the socket write, and for a provider that
    #: acts on a request a little after its client stopped waiting
    settle_margin: float | None = None
    #: how often the worker's reaper refreshes the store-wide metrics gauges
    stats_interval: float = 10.0
    #: ``[retention] keep``: the reaper prunes deliveries finished longer ago than this
    #: (None: never; ``kirim.store.retention``)
    retention_keep: float | None = None
    #: ``[retention] keys``: how long a pruned delivery's key is still refused a new one
    retention_keys: float = 365 * DAY
    #: ``[retention] archived``: an archived (or deleted) feed message goes this long
    #: after it was archived (None: with the others, ``keep`` after it came)
    retention_archived: float | None = None

    def __post_init__(self) -> None:
        """Raise ``BadValue`` (a ``ConfigError`` and a ``ValueError``) naming the setting."""
        for name, rule in RULES.items():
            rule.check(name, getattr(self, name))
        for name in ("heartbeat_interval", "send_margin"):
            value = getattr(self, name)
            if value is not None and not value < self.lease:
                raise BadValue(name, f"must be less than the lease ({self.lease:g}), not {value:g}")

    @property
    def send_within(self) -> float:
        """Seconds after its claim within which a delivery's request may still leave."""
        margin = self.lease / 5 if self.send_margin is None else self.send_margin
        return self.lease - margin

    @property
    def settle_allowance(self) -> float:
        """Seconds added to ``send deadline + request timeout`` to make ``settles_at``."""
        return self.lease if self.settle_margin is None else self.settle_margin

    @property
    def heartbeat_every(self) -> float:
        return self.heartbeat_interval or self.lease / 3

    @property
    def reap_every(self) -> float:
        return self.reap_interval or min(self.lease / 2, 5.0)


def default_worker_id() -> str:
    """host-pid-random: unique per process, readable in logs."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"
