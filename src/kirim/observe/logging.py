"""Structured logs with the fixed field names that ``kirim analyze`` reads back.

Every line of the delivery path carries ``notification_id``, ``event_id``,
``job_id``, ``attempt``, ``worker_id``, ``idempotency_key`` and, once a request
exists, ``provider_request_id``. logfmt by default, JSON lines on request.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog

#: Field names whose values are never written to a log.
SECRET_KEYS = frozenset(
    {"token", "authorization", "password", "secret", "api_key", "apikey", "credentials"}
)
KEY_ORDER = ["ts", "level", "event"]
LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Replace the value of any secret-looking field with ``***``."""
    for key in event:
        if key.lower() in SECRET_KEYS or key.lower().endswith(("_token", "_secret", "_password")):
            event[key] = "***"
    return event


def configure(*, fmt: str = "logfmt", level: str = "info", stream: TextIO | None = None) -> None:
    """Set up structlog for kirim's processes (CLI, worker, service)."""
    if fmt not in ("logfmt", "json"):
        raise ValueError(f"log format must be logfmt or json, not {fmt!r}")
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, not {level!r}")
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.processors.LogfmtRenderer(key_order=KEY_ORDER, bool_as_flag=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
            redact,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=stream or sys.stderr),
        cache_logger_on_first_use=True,
    )


def get_logger(**context: Any) -> Any:
    return structlog.get_logger("kirim").bind(**context)
