"""How a worker runs: lease, concurrency, batching, polling, backoff, shutdown."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass


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

    def __post_init__(self) -> None:
        if self.lease <= 0:
            raise ValueError("lease must be positive")
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if not self.request_timeout > 0:
            raise ValueError("request_timeout must be positive")
        if self.send_margin is not None and not 0 <= self.send_margin < self.lease:
            raise ValueError("send_margin must be at least 0 and less than the lease")

    @property
    def send_within(self) -> float:
        """Seconds after its claim within which a delivery's request may still leave."""
        margin = self.lease / 5 if self.send_margin is None else self.send_margin
        return self.lease - margin

    @property
    def heartbeat_every(self) -> float:
        return self.heartbeat_interval or self.lease / 3

    @property
    def reap_every(self) -> float:
        return self.reap_interval or min(self.lease / 2, 5.0)


def default_worker_id() -> str:
    """host-pid-random: unique per process, readable in logs."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"
