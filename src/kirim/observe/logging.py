"""Structured logs with the fixed field names that ``kirim analyze`` reads back.

Every line of the delivery path carries ``notification_id``, ``event_id``,
``job_id``, ``attempt``, ``worker_id``, ``idempotency_key`` and, once a request
exists, ``provider_request_id``. logfmt by default, JSON lines on request.

As a library kirim writes nothing itself: until someone configures structlog (the
CLI does, with :func:`configure`; so may the application), kirim's events go to the
standard ``logging`` module's ``kirim`` logger, which has only a ``NullHandler``, as
a message ``event=enqueued notification_id=7 …``. The application decides where
they go (``logging.basicConfig(level=logging.INFO)`` shows them). A stream closed
under a process (``kirim worker 2>&1 | head -1``) drops its lines, never the process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator, MutableMapping
from typing import Any, TextIO, cast

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
#: the standard library logger kirim writes to when structlog is not configured
STDLIB_LOGGER = "kirim"
logging.getLogger(STDLIB_LOGGER).addHandler(logging.NullHandler())


def redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Replace the value of any secret-looking field with ``***``."""
    for key in event:
        if key.lower() in SECRET_KEYS or key.lower().endswith(("_token", "_secret", "_password")):
            event[key] = "***"
    return event


def configure(*, fmt: str = "logfmt", level: str = "info", stream: TextIO | None = None) -> None:
    """Set up structlog for kirim's processes (CLI, worker, service): lines on ``stream``
    (else whatever ``sys.stderr`` is when a line is written)."""
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
        logger_factory=structlog.PrintLoggerFactory(file=cast(TextIO, Sink(stream))),
        cache_logger_on_first_use=True,
    )


class Sink:
    """A text stream for log lines that a closed reader cannot stop.

    ``stream`` None follows ``sys.stderr``. Once a write finds the pipe closed (the
    reader went away) or the stream closed, every later line is dropped, and a pipe's
    descriptor is pointed at ``/dev/null`` so that nothing else in the process (the
    interpreter's last flush included) fails on it. Shutdown never waits on a log.
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream
        self.closed = False

    def write(self, text: str) -> int:
        if not self.closed:
            with self._guard():
                (self._stream or sys.stderr).write(text)
        return len(text)

    def flush(self) -> None:
        if not self.closed:
            with self._guard():
                (self._stream or sys.stderr).flush()

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        try:
            yield
        except BrokenPipeError:
            self.closed = True
            _to_devnull(self._stream or sys.stderr)
        except ValueError:  # I/O operation on a closed file
            self.closed = True
        except OSError:
            pass  # this line is lost (a full disk); the next one may get through


def _to_devnull(stream: TextIO) -> None:
    """Point the descriptor under ``stream`` at /dev/null (if it has one)."""
    with contextlib.suppress(AttributeError, OSError, ValueError):
        fd = stream.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)


_LOGFMT = structlog.processors.LogfmtRenderer(key_order=["event"], bool_as_flag=False)


def _to_stdlib(
    logger: Any, method: str, event: MutableMapping[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The last step for the stdlib: one logfmt message, the exception as ``exc_info``."""
    exc_info = event.pop("exc_info", None)
    return (_LOGFMT(logger, method, event),), ({"exc_info": exc_info} if exc_info else {})


#: the library's pipeline: kirim's fields as one logfmt message on the stdlib logger
_STDLIB_PROCESSORS: list[Any] = [
    structlog.stdlib.filter_by_level,
    structlog.contextvars.merge_contextvars,
    redact,
    _to_stdlib,
]


def get_logger(**context: Any) -> Any:
    """kirim's logger, with ``context`` bound: through structlog's configuration once
    there is one (the CLI's, the application's), else to the stdlib ``kirim`` logger."""
    if structlog.is_configured():
        return structlog.get_logger("kirim").bind(**context)
    logger = structlog.wrap_logger(
        logging.getLogger(STDLIB_LOGGER),
        processors=_STDLIB_PROCESSORS,
        wrapper_class=structlog.stdlib.BoundLogger,
        context_class=dict,
        cache_logger_on_first_use=False,
    )
    return logger.bind(**context)
