"""The CLI's parameter types: kirim.validation's rules, applied to flags and arguments.

A flag gets the same rule, and the same reason in its message, as the setting it
overrides in kirim.toml (``--lease nan`` and ``lease = nan``); text that no backend can
store (NUL, lone surrogates) is refused before any command body runs, and so are
paths that no file system call can take.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import click

from kirim.limits import Limit
from kirim.validation import (
    BadValue,
    Number,
    check_key,
    check_text,
    require_duration,
    text_problem,
)

if TYPE_CHECKING:
    _ParamType = click.ParamType[Any]  # generic from click 8.2 on
    _Path = click.Path[Any]
else:
    _ParamType = click.ParamType
    _Path = click.Path


class NumberParam(_ParamType):
    """A flag for a numeric setting, checked by the rule kirim.toml's value meets."""

    def __init__(self, rule: Number) -> None:
        self.rule = rule
        self.name = "integer" if rule.integer else "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        parsed = _number(value) if isinstance(value, str) else value
        try:
            return self.rule.check(_name(param), parsed)
        except BadValue as exc:
            self.fail(exc.reason, param, ctx)


def _number(text: str) -> Any:
    """An int, else a float (nan and inf included: the rule refuses them), else the text."""
    value = text.strip()
    with contextlib.suppress(ValueError):
        return int(value)
    if not value.lstrip("+-").isdigit():  # a number past int's digit limit stays text
        with contextlib.suppress(ValueError):
            return float(value)
    return text


class DurationParam(_ParamType):
    """A duration flag (``30d``, ``12h``, ``90m``, or seconds), checked by the rule of the
    setting it overrides in kirim.toml; the value is in seconds."""

    name = "duration"

    def __init__(self, rule: Number) -> None:
        self.rule = rule

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        parsed = (
            _number(value) if isinstance(value, str) and value.strip()[-1:].isdigit() else value
        )
        try:
            return require_duration(_name(param), parsed, self.rule)
        except BadValue as exc:
            self.fail(exc.reason, param, ctx)


class TextParam(_ParamType):
    """Text every backend can store (no NUL, no lone surrogate, no control character),
    within ``limit`` (bytes, ``kirim.limits``); ``key`` adds the rule of explicit
    idempotency keys (printable ASCII, at most 255 characters)."""

    name = "text"

    def __init__(self, *, key: bool = False, limit: Limit | None = None) -> None:
        self.key = key
        self.limit = limit

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            if self.key:
                return check_key(value, _name(param))
            return check_text(_name(param), value, limit=self.limit)
        except BadValue as exc:
            self.fail(exc.reason, param, ctx)


class PathParam(_Path):
    """``click.Path``, but a path with a NUL or a lone surrogate is a usage error (click's
    own check would let ``os.stat`` raise ValueError or UnicodeEncodeError)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and (problem := text_problem(value)) is not None:
            self.fail(f"a path {problem}", param, ctx)
        return super().convert(value, param, ctx)


def _name(param: click.Parameter | None) -> str:
    return param.name if param is not None and param.name else "value"
