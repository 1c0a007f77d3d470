"""Prometheus metrics for kirim: what the worker and ``notify()`` did, and the queue.

A ``Metrics`` owns its own ``CollectorRegistry``, so that tests and several workers
in one process never collide. Give the same object to ``Kirim`` and ``Worker``
(``Kirim(metrics=m)``, ``app.worker()`` passes it on); ``None`` means no metrics at
all. ``render()`` is the text exposition; ``serve()`` starts a /metrics endpoint.

The hot path touches pre-resolved children (one dict lookup and an increment per
event); gauges are refreshed from ``Store.queue_stats`` by the worker's reaper every
``stats_interval`` seconds, never per delivery.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, Literal, get_args

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)

from kirim.errors import ConfigError
from kirim.model import AttemptStatus
from kirim.observe import RESULT
from kirim.store.base import QueueStats

#: Seconds: from a few milliseconds to the longest provider timeouts.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Seconds: a commit usually takes milliseconds; a long tail means a slow database.
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
#: why a retry was scheduled: refused and certainly not processed, an unknown outcome
#: resent under the channel's policy, or a lease the reaper found expired
RetryKind = Literal["transient", "unknown", "lease_expired"]
RETRY_KINDS: tuple[RetryKind, ...] = get_args(RetryKind)
RESULTS = RESULT
CONTENT_TYPE = CONTENT_TYPE_LATEST


class _Children:
    """Label children resolved once per label values (``labels()`` is slow-ish)."""

    __slots__ = ("_cache", "_make")

    def __init__(self, make: Callable[..., Any]) -> None:
        self._make = make
        self._cache: dict[Hashable, Any] = {}

    def __call__(self, *values: str) -> Any:
        child = self._cache.get(values)
        if child is None:
            child = self._cache[values] = self._make(*values)
        return child


class Metrics:
    """kirim's metrics on a registry of their own (see docs/observability.md, "Metrics")."""

    def __init__(
        self, registry: CollectorRegistry | None = None, *, stats_interval: float = 10.0
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        #: how often (seconds) a worker refreshes the gauges from the store
        self.stats_interval = stats_interval
        r = self.registry
        self.retries = Counter(
            "kirim_retries",
            "Retries scheduled, by reason: transient (refused, certainly not processed), "
            "unknown (outcome unknown, resent under the channel's policy), lease_expired "
            "(returned to the queue by the reaper).",
            ["channel", "kind"],
            registry=r,
        )
        self.enqueue_conflicts = Counter(
            "kirim_enqueue_conflicts",
            "notify() calls whose idempotency key already existed (unique-key conflicts).",
            ["channel"],
            registry=r,
        )
        self.provider_to_commit = Histogram(
            "kirim_provider_to_commit_seconds",
            "Time from the provider's answer to the committed delivery status.",
            buckets=COMMIT_BUCKETS,
            registry=r,
        )
        self.provider_latency = Histogram(
            "kirim_provider_latency_seconds",
            "Provider request latency, by channel and result.",
            ["channel", "result"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.provider_requests = Counter(
            "kirim_provider_requests",
            "Outbound provider requests, by channel and result.",
            ["channel", "result"],
            registry=r,
        )
        self.multi_request_deliveries = Counter(
            "kirim_multi_request_deliveries",
            "Deliveries that saw more than one outbound request (counted once, when the "
            "second request is sent).",
            ["channel"],
            registry=r,
        )
        self.failovers = Counter(
            "kirim_failovers",
            "Attempts sent to a fallback channel after the one before certainly did not "
            "accept the delivery, by the delivery's channel and the fallback (to).",
            ["channel", "to"],
            registry=r,
        )
        self.deliveries = Gauge(
            "kirim_deliveries", "Deliveries in the store, by status.", ["status"], registry=r
        )
        self.in_doubt = Gauge(
            "kirim_in_doubt_deliveries",
            "Deliveries in doubt: status in_doubt, or sent under the assume_sent policy.",
            registry=r,
        )
        self.queue_depth = Gauge(
            "kirim_queue_depth", "Claimable jobs that are due now.", registry=r
        )
        self.oldest_due_age = Gauge(
            "kirim_oldest_due_job_age_seconds",
            "How long the oldest due job has been waiting (0 when none is due).",
            registry=r,
        )
        self.leases_expired = Counter(
            "kirim_leases_expired", "Job leases found expired by this process's reaper.", registry=r
        )
        self.stale_writes_rejected = Counter(
            "kirim_stale_writes_rejected",
            "Outcome writes refused because the claim token no longer held "
            "(late successes included).",
            registry=r,
        )
        self.late_successes = Counter(
            "kirim_late_successes",
            "Successes reported after the claim was lost, kept: the delivery is sent.",
            registry=r,
        )
        self.dead_lettered = Counter(
            "kirim_dead_lettered", "Jobs dead-lettered, by channel.", ["channel"], registry=r
        )
        self.callbacks = Counter(
            "kirim_callbacks",
            "Provider delivery callbacks verified, by channel, the status they reported "
            "(delivered, bounced, failed) and their outcome (applied, recorded, repeated, "
            "unknown).",
            ["channel", "status", "outcome"],
            registry=r,
        )
        self.confirmed_duplicates = Counter(
            "kirim_confirmed_duplicates",
            "Measured duplicates: a provider confirmed a second (third...) message id for "
            "one notification.",
            ["channel"],
            registry=r,
        )
        self.suppressed_deliveries = Counter(
            "kirim_suppressed",
            "Deliveries suppressed by the notification layer, by channel and reason "
            "(opted_out, channel_opted_out, not_opted_in: the recipient's preferences, at "
            "enqueue or at claim time; throttled: over the type's throttle).",
            ["channel", "reason"],
            registry=r,
        )
        self.rate_waits = Histogram(
            "kirim_rate_wait_seconds",
            "Seconds a request waited for its channel's request rate (`rate`) before its "
            "intent; one too far for its claim's send deadline puts the job back and is "
            "observed with the wait it was given.",
            ["channel"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
            registry=r,
        )
        self._retries = _Children(self.retries.labels)
        self._conflicts = _Children(self.enqueue_conflicts.labels)
        self._latency = _Children(self.provider_latency.labels)
        self._requests = _Children(self.provider_requests.labels)
        self._multi = _Children(self.multi_request_deliveries.labels)
        self._dead = _Children(self.dead_lettered.labels)
        self._failovers = _Children(self.failovers.labels)
        self._callbacks = _Children(self.callbacks.labels)
        self._duplicates = _Children(self.confirmed_duplicates.labels)
        self._suppressed = _Children(self.suppressed_deliveries.labels)
        self._rate_waits = _Children(self.rate_waits.labels)
        self._server: Any = None
        #: the port /metrics is served on (after ``serve``)
        self.port: int | None = None
        self._server_thread: threading.Thread | None = None

    # -- events (hot path: a dict lookup and an increment each) -----------------------

    def retry(self, channel: str, kind: RetryKind) -> None:
        self._retries(channel, kind).inc()

    def enqueue_conflict(self, channel: str) -> None:
        self._conflicts(channel).inc()

    def provider_response(self, channel: str, status: AttemptStatus, seconds: float) -> None:
        result = RESULTS[status]
        self._latency(channel, result).observe(seconds)
        self._requests(channel, result).inc()

    def committed(self, seconds: float) -> None:
        self.provider_to_commit.observe(seconds)

    def multi_request(self, channel: str) -> None:
        self._multi(channel).inc()

    def dead_letter(self, channel: str) -> None:
        self._dead(channel).inc()

    def failover(self, channel: str, to: str) -> None:
        self._failovers(channel, to).inc()

    def callback(self, channel: str, status: str, outcome: str, *, duplicate: bool) -> None:
        self._callbacks(channel, status, outcome).inc()
        if duplicate:
            self._duplicates(channel).inc()

    def suppressed(self, channel: str, reason: str) -> None:
        """A delivery recorded ``suppressed`` (``kirim.preferences.Reason``)."""
        self._suppressed(channel, reason).inc()

    def rate_wait(self, channel: str, seconds: float) -> None:
        """A request of ``channel`` waited (or was put back) for its request rate."""
        self._rate_waits(channel).observe(seconds)

    def lease_expired(self) -> None:
        self.leases_expired.inc()

    def stale_write(self, *, late_success: bool) -> None:
        self.stale_writes_rejected.inc()
        if late_success:
            self.late_successes.inc()

    def set_queue_stats(self, stats: QueueStats) -> None:
        """Set the gauges from one snapshot of the store."""
        for status, n in stats.deliveries.items():
            self.deliveries.labels(status).set(n)
        self.in_doubt.set(stats.in_doubt)
        self.queue_depth.set(stats.queue_depth)
        self.oldest_due_age.set(stats.oldest_due_age_s)

    # -- exposition -------------------------------------------------------------------

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry (``CONTENT_TYPE``)."""
        return generate_latest(self.registry)

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve /metrics on ``host:port`` from a daemon thread; return the bound port.

        Bound to loopback unless told otherwise: metrics name channels and volumes.
        Port 0 picks a free port.
        """
        if self._server is not None:
            raise RuntimeError("metrics are already served")
        try:
            server, thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}; "
                "choose another --metrics-port or --metrics-host"
            ) from None
        self._server, self._server_thread = server, thread
        self.port = int(server.server_port)
        return self.port

    def close(self) -> None:
        """Stop the /metrics endpoint, if serving."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._server_thread is not None:
            self._server_thread.join(timeout=5)
            self._server_thread = None


__all__ = ["CONTENT_TYPE", "LATENCY_BUCKETS", "RETRY_KINDS", "Metrics", "RetryKind"]
