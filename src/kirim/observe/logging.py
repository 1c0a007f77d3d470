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
import functools
import logging
import os
import re
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO, cast

import structlog

from kirim.text import CONTROL, escape_char, secret_field

KEY_ORDER = ["ts", "level", "event"]
LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
#: the formats a log line can take (``configure``)
FORMATS = ("logfmt", "json")
#: the standard library logger kirim writes to when structlog is not configured
STDLIB_LOGGER = "kirim"
logging.getLogger(STDLIB_LOGGER).addHandler(logging.NullHandler())


#: whether a field name holds a secret, by name: a worker writes a few dozen names,
#: several times per delivery, and ``secret_field`` is a dozen string tests
_secret = functools.lru_cache(maxsize=4096)(secret_field)


def redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Replace the value of any secret-looking field with ``***``."""
    for key in event:
        if _secret(key):
            event[key] = "***"
    return event


# -- logfmt ----------------------------------------------------------------------------

#: a character that breaks a field (a value must be quoted; a name's is written ``_``)
_NEEDS_QUOTES = re.compile(r'[ ="\\]')
#: a character that makes a value more than its bare text: quoting or an escape
_NOT_BARE = re.compile(f"{_NEEDS_QUOTES.pattern}|{CONTROL.pattern}")


def logfmt_value(value: Any) -> str:
    r"""One value as logfmt writes it: bare when it can be (``sent``, ``7``); else in
    double quotes with ``\\`` and ``\"`` escaped. A control character is escaped in
    either form (``\r``, ``\x1b``, ``\u2028``: ``kirim.text.escape_char``), so that a
    value can neither end its line nor drive a terminal; ``kirim analyze`` reads every
    escape back."""
    kind = type(value)
    if kind is int or kind is float:  # never a space, quote, backslash nor control
        return str(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    if _NOT_BARE.search(text) is None:  # the common case: one search
        return text
    control = CONTROL.search(text) is not None
    text = text.replace("\\", "\\\\").replace('"', '\\"')
    if control:
        text = CONTROL.sub(lambda m: escape_char(m.group()), text)
    return f'"{text}"'


@functools.lru_cache(maxsize=4096)
def logfmt_key(key: str) -> str:
    """A field's name as logfmt writes it: each space, ``=``, quote, backslash or control
    character (which would break the line's fields) written ``_``. Cached: a process
    writes a few dozen names, over and over."""
    return _NOT_BARE.sub("_", key)


class LogfmtRenderer:
    """structlog's last step for logfmt: ``key_order`` first, the rest as bound (each
    key once), every value through ``logfmt_value``."""

    def __init__(self, key_order: list[str]) -> None:
        self.key_order = key_order
        self._ordered = frozenset(key_order)

    def __call__(self, _: Any, __: str, event: MutableMapping[str, Any]) -> str:
        first = [k for k in self.key_order if k in event]
        rest = [k for k in event if k not in self._ordered]
        return " ".join([f"{logfmt_key(str(k))}={logfmt_value(event[k])}" for k in (*first, *rest)])


def configure(*, fmt: str = "logfmt", level: str = "info", stream: TextIO | None = None) -> None:
    """Set up structlog for kirim's processes (CLI, worker, service): lines on ``stream``
    (else whatever ``sys.stderr`` is when a line is written)."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be logfmt or json, not {fmt!r}")
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, not {level!r}")
    renderer: Any = (
        structlog.processors.JSONRenderer()  # ensure_ascii: every control escaped
        if fmt == "json"
        else LogfmtRenderer(key_order=KEY_ORDER)
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
        # one write and one flush per line (print writes the line and its newline apart)
        logger_factory=structlog.WriteLoggerFactory(file=cast(TextIO, Sink(stream))),
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
            try:
                (self._stream or sys.stderr).write(text)
            except (OSError, ValueError) as exc:
                self._failed(exc)
        return len(text)

    def flush(self) -> None:
        if not self.closed:
            try:
                (self._stream or sys.stderr).flush()
            except (OSError, ValueError) as exc:
                self._failed(exc)

    def _failed(self, exc: OSError | ValueError) -> None:
        """A write or flush failed: a closed pipe or stream drops every later line; any
        other error (a full disk) loses this line only."""
        if isinstance(exc, BrokenPipeError):
            self.closed = True
            _to_devnull(self._stream or sys.stderr)
        elif isinstance(exc, ValueError):  # I/O operation on a closed file
            self.closed = True


def _to_devnull(stream: TextIO) -> None:
    """Point the descriptor under ``stream`` at /dev/null (if it has one)."""
    with contextlib.suppress(AttributeError, OSError, ValueError):
        fd = stream.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)


_LOGFMT = LogfmtRenderer(key_order=["event"])


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


class _StdlibLogger(structlog.stdlib.BoundLogger):
    """The library's route: a line the ``kirim`` logger would not write is dropped before
    structlog's processors see it (``filter_by_level`` drops it too, but only after the
    event was made, and by raising an exception): an application that leaves the
    standard library at its default level (warning) pays nothing for kirim's info
    lines, four per delivery in a worker."""

    def debug(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        if self._logger.isEnabledFor(logging.DEBUG):
            return super().debug(event, *args, **kw)
        return None

    def info(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        if self._logger.isEnabledFor(logging.INFO):
            return super().info(event, *args, **kw)
        return None


def get_logger(**context: Any) -> Any:
    """kirim's logger, with ``context`` bound: through structlog's configuration once
    there is one (the CLI's, the application's), else to the stdlib ``kirim`` logger."""
    if structlog.is_configured():
        return structlog.get_logger("kirim").bind(**context)
    logger = structlog.wrap_logger(
        logging.getLogger(STDLIB_LOGGER),
        processors=_STDLIB_PROCESSORS,
        wrapper_class=_StdlibLogger,
        context_class=dict,
        cache_logger_on_first_use=False,
    )
    return logger.bind(**context)
