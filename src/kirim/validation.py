"""The rules every door applies to what it is given: numbers, text, payloads.

kirim.toml (``kirim.config``), the CLI's flags (``kirim.cli.params``), ``WorkerSettings``,
``Config``, ``notify()`` and the HTTP API (through ``Kirim.prepare``) all call
these functions, so one bad value gets one message wherever it comes in. They raise
``BadValue``: a ``ConfigError`` (and a ``ValueError``) whose ``name`` is the setting and
``reason`` the rest of the sentence; ``notify()`` re-raises it as ``InvalidNotification``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, overload

from kirim import limits
from kirim.errors import ConfigError
from kirim.limits import Limit
from kirim.text import escape_char, first_control

#: the largest id an integer column holds
MAX_ID = 2**63 - 1
#: idempotency keys travel in HTTP headers and database indexes: at most this long
#: (printable ASCII: as many bytes as characters; ``kirim.limits.KEY``)
MAX_KEY_LENGTH = limits.KEY.bytes
#: the latest time kirim can show or store: 9999-12-31T23:59:59Z, in epoch seconds
MAX_EPOCH = 253_402_300_799.0
DAY = 86_400.0
_SHOWN = 40  # characters of a bad value quoted in a message


class BadValue(ConfigError, ValueError):
    """A value outside its rule: ``f"{name} {reason}"``."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"{name} {reason}")
        self.name = name
        self.reason = reason


def shown(value: Any) -> str:
    """``repr(value)`` fit for a one-line message: escaped (NUL, lone surrogates) and short."""
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


# -- numbers ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Number:
    """A numeric setting's rule: integer or not, its range, its unit, None allowed."""

    minimum: float
    maximum: float
    #: the minimum itself is excluded ("greater than 0")
    above: bool = False
    integer: bool = False
    unit: str = ""
    optional: bool = False

    def describe(self) -> str:
        what = "an integer" if self.integer else "a number"
        if self.unit:
            what += f" of {self.unit}"
        low, high = _num(self.minimum), _num(self.maximum)
        if self.above:
            return f"{what} greater than {low} and at most {high}"
        return f"{what} from {low} to {high}"

    def check(self, name: str, value: Any) -> Any:
        """``value`` if it follows the rule (None too when optional); BadValue otherwise."""
        if value is None and self.optional:
            return None
        return require_number(
            name,
            value,
            minimum=self.minimum,
            maximum=self.maximum,
            above=self.above,
            integer=self.integer,
            what=self.describe(),
        )


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


@overload
def require_number(
    name: str,
    value: Any,
    *,
    minimum: float,
    maximum: float,
    above: bool = ...,
    integer: Literal[True],
    what: str | None = ...,
) -> int: ...
@overload
def require_number(
    name: str,
    value: Any,
    *,
    minimum: float,
    maximum: float,
    above: bool = ...,
    integer: Literal[False] = ...,
    what: str | None = ...,
) -> float: ...
@overload
def require_number(
    name: str,
    value: Any,
    *,
    minimum: float,
    maximum: float,
    above: bool = ...,
    integer: bool,
    what: str | None = ...,
) -> float: ...
def require_number(
    name: str,
    value: Any,
    *,
    minimum: float,
    maximum: float,
    above: bool = False,
    integer: bool = False,
    what: str | None = None,
) -> float:
    """``value`` if it is a finite number (an ``int`` when ``integer``) within the range.

    Booleans, strings, nan and the infinities never are; the message says what is
    expected and what was given, in one line.
    """
    rule = what or Number(minimum=minimum, maximum=maximum, above=above, integer=integer).describe()
    exact = isinstance(value, int) and not isinstance(value, bool)
    finite = isinstance(value, float) and not integer and math.isfinite(value)
    if not (exact or finite):
        raise BadValue(name, f"must be {rule}, not {shown(value)}")
    number: float = value
    low_ok = number > minimum if above else number >= minimum
    if not (low_ok and number <= maximum):
        raise BadValue(name, f"must be {rule}, not {shown(value)}")
    return number


# -- durations ---------------------------------------------------------------------------

#: a duration as people write one: ``30s``, ``5m``, ``12h``, ``30d``, ``1h30m``, ``500ms``
DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": DAY}


def parse_duration(text: str) -> float | None:
    """The seconds of a duration such as ``30d``, ``12h`` or ``1h30m``; None if ``text``
    is not one (the grammar of ``kirim send --send-after``)."""
    value = text.strip()
    if not value or DURATION.sub("", value) != "":
        return None
    return sum(float(n) * DURATION_UNITS[unit] for n, unit in DURATION.findall(value))


def require_duration(name: str, value: Any, rule: Number) -> Any:
    """A duration (``"30d"``, ``"12h"``) or a number of seconds, checked by ``rule``."""
    if isinstance(value, str):
        seconds = parse_duration(value)
        if seconds is None:
            raise BadValue(
                name, f"must be a duration such as 30d, 12h or 90m (or seconds), not {shown(value)}"
            )
        value = seconds
    return rule.check(name, value)


def check_rules(rules: Mapping[str, Number], values: Mapping[str, Any]) -> None:
    """Apply each rule to the value of the same name."""
    for name, rule in rules.items():
        rule.check(name, values[name])


def as_id(text: str) -> int | None:
    """The id (1 to 2**63 - 1, what an integer column holds) that ``text`` names as ASCII
    digits, or None: never an OverflowError or Python's digit-limit ValueError."""
    if not (text.isascii() and text.isdigit()) or len(text) > 19:
        return None
    number = int(text)
    return number if 0 < number <= MAX_ID else None


# -- text ------------------------------------------------------------------------------


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored as text by every backend, or None.

    PostgreSQL's text cannot hold NUL, and a lone surrogate has no UTF-8 form.
    """
    if "\x00" in value:
        return "must not contain NUL characters"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid Unicode text (no lone surrogates)"
    return None


def check_text(
    name: str,
    value: Any,
    *,
    limit: Limit | None = None,
    ascii: bool = False,
    line: bool = True,
) -> str:
    """``value`` if it is a non-blank string every backend can store, within ``limit``
    (bytes of UTF-8, ``kirim.limits``); ``line`` (ids, names, addresses): without
    control characters (``kirim.text.CONTROL``: a line break, an escape sequence), so
    that it cannot forge a log line or drive a terminal; with ``ascii``, printable ASCII
    without surrounding spaces (the form an HTTP header carries unchanged)."""
    if not isinstance(value, str) or not value.strip():
        raise BadValue(name, "is required (a non-empty string)")
    if (problem := text_problem(value)) is not None:
        raise BadValue(name, problem)
    if ascii and (not all(" " <= c <= "~" for c in value) or value != value.strip()):
        raise BadValue(
            name,
            "must be printable ASCII without leading or trailing spaces "
            f"(it travels in HTTP headers), not {shown(value)}",
        )
    if line and (char := first_control(value)) is not None:
        raise BadValue(name, f"must not contain control characters ({escape_char(char)})")
    if limit is not None and (problem := limit.problem(value)) is not None:
        raise BadValue(name, problem)
    return value


def check_key(value: Any, name: str = "key") -> str:
    """An explicit idempotency key: printable ASCII, at most ``MAX_KEY_LENGTH`` characters."""
    return check_text(name, value, limit=limits.KEY, ascii=True)


# -- payloads --------------------------------------------------------------------------

#: where a value sits in a payload: (the parent's place, its key or index), or None
_Place = tuple["_Place", str | int] | None


def check_payload(value: Any) -> None:
    """Refuse NUL and lone surrogates anywhere in a JSON payload: in every string value
    and every object key, however deep (iteratively: no recursion limit)."""
    stack: list[tuple[Any, _Place]] = [(value, None)]
    while stack:
        node, place = stack.pop()
        if isinstance(node, str):
            if (problem := text_problem(node)) is not None:
                raise BadValue(_path(place), problem)
        elif isinstance(node, Mapping):
            for k, v in node.items():
                if isinstance(k, str) and (problem := text_problem(k)) is not None:
                    raise BadValue(f"a key in {_path(place)}", problem)
                stack.append((v, (place, k)))
        elif isinstance(node, list | tuple):
            stack.extend((v, (place, i)) for i, v in enumerate(node))


def _path(place: _Place) -> str:
    parts: list[str] = []
    while place is not None:
        place, step = place
        parts.append(f"[{step}]" if isinstance(step, int) else f"[{shown(step)}]")
    return "payload" + "".join(reversed(parts))
