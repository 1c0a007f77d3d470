"""The readable timeline of one schedule, its hash, and the failure file.

Hosts, the provider model and the fault driver append lines; the workers' own log
events (structlog) are captured too, so the timeline reads like the dashboard's
pseudo-log::

    t=12.300 host=A job_claimed delivery=2 job=2 attempt=1
    t=12.301 host=P provider_request key=k2 req=r3 outcome=accepted effect_at=19.100

Random ids (fencing tokens, ``req-<uuid>``) are replaced by their order of first
appearance (``r1``, ``r2`` …) so that the same schedule gives the same text, and
the same hash, in any process.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from kirim.explore.loop import HOST

#: log fields worth a place in the timeline, in this order
FIELDS = (
    "notification_id",
    "job_id",
    "attempt",
    "provider_request_id",
    "decision",
    "result",
    "status",
    "job_status",
    "doubt",
    "reason",
    "error",
    "lease_owner",
    "dead",
)
SHORT = {"notification_id": "delivery", "job_id": "job", "provider_request_id": "req"}
FORMAT_VERSION = 1


@dataclass(slots=True)
class Trace:
    clock: Callable[[], float]
    lines: list[str] = field(default_factory=list)
    ids: dict[str, str] = field(default_factory=dict)

    def rid(self, request_id: str | None) -> str:
        """A stable short name for a random request id."""
        if request_id is None:
            return "-"
        name = self.ids.get(request_id)
        if name is None:
            name = self.ids[request_id] = f"r{len(self.ids) + 1}"
        return name

    def add(self, text: str, *, host: str | None = None) -> None:
        if host is None:
            current = HOST.get()
            host = "-" if current is None else current.label
        self.lines.append(f"t={self.clock():.3f} host={host} {text}")

    def log_event(self, event: MutableMapping[str, Any]) -> None:
        parts = [str(event.get("event", "?"))]
        for name in FIELDS:
            value = event.get(name)
            if value is None:
                continue
            if name == "provider_request_id":
                value = self.rid(str(value))
            elif name == "error":
                value = json.dumps(str(value)[:80])
            parts.append(f"{SHORT.get(name, name)}={value}")
        self.add(" ".join(parts))

    def digest(self) -> str:
        return hashlib.sha256("\n".join(self.lines).encode()).hexdigest()


@contextmanager
def capture_logs(trace: Trace) -> Iterator[None]:
    """Route kirim's structlog events into ``trace`` (and nowhere else) meanwhile."""
    previous = structlog.get_config()

    def processor(_: Any, __: str, event: MutableMapping[str, Any]) -> Any:
        trace.log_event(event)
        raise structlog.DropEvent

    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, processor],
        wrapper_class=structlog.make_filtering_bound_logger(0),
        cache_logger_on_first_use=False,
    )
    try:
        yield
    finally:
        structlog.configure(**previous)


def write_failure(path: Path, record: dict[str, Any]) -> Path:
    """Write a failure file (configuration, fault plan, choices, timeline)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"format": FORMAT_VERSION, **record}
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def read_failure(path: Path) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(path.read_text())
    if record.get("format") != FORMAT_VERSION:
        raise ValueError(f"{path}: not an explorer failure file (format {FORMAT_VERSION})")
    return record
