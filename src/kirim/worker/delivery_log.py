"""The logger of one delivery: its fields bound only when one of its lines is written.

The ``Deliverer`` logs each delivery with a handful of fields (its notification, event,
job, attempt, key and channel; its request id once it has one), and writes four
``info`` lines on the common path. At ``warning`` (``kirim bench``'s level, and any
application's that leaves the standard library's default) none of those lines is
written, yet binding the fields (a new structlog logger, twice per delivery) and, on
the standard library's route, running each ``info`` through structlog's processors
until ``filter_by_level`` drops it cost the worker several microseconds per delivery.
``DeliveryLog`` asks the logger once per delivery whether ``info`` is on, and binds
its fields the first time a line is written: the lines, when written, are the ones
``log.bind(**fields).info(...)`` writes.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["DeliveryLog", "enabled"]


def enabled(log: Any, level: int) -> bool:
    """Whether ``log`` writes lines at ``level``: structlog's own loggers answer
    ``is_enabled_for``, its standard-library one ``isEnabledFor``; a logger that
    answers neither is taken to write them all."""
    check = getattr(log, "is_enabled_for", None) or getattr(log, "isEnabledFor", None)
    return True if check is None else bool(check(level))


class DeliveryLog:
    """``base`` with ``fields`` bound, lazily (see the module docstring). Its methods
    are the ones the delivery path calls on a structlog logger."""

    __slots__ = ("_base", "_bound", "_fields", "_info")

    def __init__(self, base: Any, fields: dict[str, Any], *, info: bool | None = None) -> None:
        self._base = base
        self._fields = fields
        self._bound: Any = None
        #: whether info lines are written (asked of ``base`` once, unless given)
        self._info = enabled(base, logging.INFO) if info is None else info

    def bind(self, **more: Any) -> DeliveryLog:
        """This logger with ``more`` fields (bound when a line is written)."""
        return DeliveryLog(self._base, {**self._fields, **more}, info=self._info)

    def _logger(self) -> Any:
        if self._bound is None:
            self._bound = self._base.bind(**self._fields)
        return self._bound

    def info(self, event: str, **fields: Any) -> None:
        if self._info:
            self._logger().info(event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._logger().warning(event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        self._logger().error(event, **fields)

    def exception(self, event: str, **fields: Any) -> None:
        self._logger().exception(event, **fields)
