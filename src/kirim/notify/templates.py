"""Templates: Jinja2 in a sandbox, with Babel's dates and numbers per locale.

Every template is compiled by one ``ImmutableSandboxedEnvironment`` (two: the ``html``
part's autoescapes, the text parts' do not), with ``StrictUndefined``: a template can
read its data but not reach Python's internals (``''.__class__``, a function's
globals) nor change what it is given (``list.append``), and a variable the data lacks
is an error, never an empty string. A failure while rendering is a ``RenderError``
that names the template, its line and the cause.

Filters, in the locale the message is written in (``kirim.locale`` in the context)::

    {{ shipped_at | date }}                  1 Des 2026          (ISO-8601 text, epoch s)
    {{ shipped_at | datetime("short", tz="Asia/Jakarta") }}
    {{ shipped_at | time }}
    {{ total | number }}                     1.500.000,5
    {{ total | currency("IDR") }}            Rp 1.500.000,50
    {{ ratio | percent }}                    25%

Locales are Babel's identifiers (``id``, ``id_ID``, ``pt_BR``; ``id-ID`` is read as
``id_ID``). A template's variant is looked up from the most specific locale to the
least, then the type's default: ``id_ID`` -> ``id`` -> ``en``.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable, Mapping
from datetime import UTC, date, datetime, time
from decimal import Decimal, InvalidOperation
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from babel import Locale, UnknownLocaleError
from babel import dates as babel_dates
from babel import numbers as babel_numbers
from jinja2 import StrictUndefined, Template, TemplateError, TemplateSyntaxError, pass_context
from jinja2.exceptions import SecurityError, UndefinedError
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kirim.errors import InvalidNotification
from kirim.notify import sandbox
from kirim.validation import shown

#: the parts a channel's template may have, in the order a payload lists them: text
#: parts, and the services' own (``kirim.notify.shapes``: ``sms`` is text, the others
#: JSON documents of templates); ``action_url`` and ``data`` (JSON) are the inbox's
PARTS = (
    *("subject", "title", "body", "html", "action_url", "sms"),
    *("apns", "fcm", "webpush", "slack", "data"),
)
#: the name under which kirim's own values (type, channel, locale, recipient) reach a
#: template; the data may not use it
RESERVED = "kirim"
#: Jinja's own filename for a template compiled from a string (in tracebacks)
_SOURCE = "<template>"
#: the largest power ``**`` may take (``kirim.notify.sandbox``: every bound of a render)
MAX_EXPONENT = sandbox.MAX_EXPONENT


class RenderError(InvalidNotification):
    """A template could not be rendered (a missing variable, a refused access, a bad
    value for a filter); nothing was written. ``field``: the data's field it names
    (``data.total`` for a missing variable ``total``), ``kind``: ``missing`` then."""

    def __init__(self, message: str, *, field: str | None = None, kind: str = "value_error"):
        super().__init__(message)
        self.field = field
        self.kind = kind


#: what a missing variable's error says (``UndefinedError``): its name
_UNDEFINED = re.compile(r"'([^']+)' is undefined|has no attribute '([^']+)'")


def _missing(exc: UndefinedError) -> str | None:
    """The data field a missing variable's error names, as ``data.NAME``."""
    found = _UNDEFINED.search(str(exc))
    return None if found is None else f"data.{found.group(1) or found.group(2)}"


# -- locales ---------------------------------------------------------------------------


def normalize_locale(value: Any) -> str:
    """Babel's form of a locale identifier (``id-ID`` -> ``id_ID``); ValueError when
    ``value`` is not one Babel knows."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"a locale is a string such as 'id' or 'id_ID', not {value!r}")
    try:
        return str(Locale.parse(value.strip().replace("-", "_")))
    except (UnknownLocaleError, ValueError, TypeError):
        raise ValueError(
            f"{value!r} is not a locale Babel knows (such as 'id' or 'id_ID')"
        ) from None


def fallbacks(locale: str | None, default: str) -> list[str]:
    """The locales to look a variant up in, most specific first, ``default`` last:
    ``zh_Hant_TW`` -> ``zh_Hant_TW``, ``zh_Hant``, ``zh``, then ``default``."""
    chain: list[str] = []
    if locale is not None:
        parsed = Locale.parse(locale)
        if parsed.territory or parsed.variant:
            chain.append(str(parsed))
        if parsed.script:
            chain.append(f"{parsed.language}_{parsed.script}")
        chain.append(parsed.language)
    chain.append(default)
    return list(dict.fromkeys(chain))


def formatting_locale(asked: str | None, written: str) -> str:
    """The locale dates and numbers are formatted in: the one asked for when the text
    is written in its language (``id_ID`` for a message in ``id``), else the text's."""
    if asked is not None and Locale.parse(asked).language == Locale.parse(written).language:
        return asked
    return written


# -- the environment -------------------------------------------------------------------


@functools.cache
def environment(*, html: bool) -> ImmutableSandboxedEnvironment:
    """The sandbox templates are compiled in (made once, then shared: bounded, see
    ``kirim.notify.sandbox``); Jinja's ``lipsum`` is left out (it makes any amount of
    text)."""
    env = sandbox.Sandbox(undefined=StrictUndefined, autoescape=html, keep_trailing_newline=False)
    env.globals.pop("lipsum", None)
    babel: dict[str, Callable[..., Any]] = {
        "date": _date,
        "datetime": _datetime,
        "time": _time,
        "number": _number,
        "currency": _currency,
        "percent": _percent,
    }
    env.filters.update({name: sandbox.bounded_filter(name, f) for name, f in babel.items()})
    return env


@functools.lru_cache(maxsize=4096)
def compile_template(source: str, *, html: bool = False) -> Template:
    """``source`` compiled (once per text); ``TemplateSyntaxError`` if it is not Jinja."""
    return environment(html=html).from_string(source)


def check_syntax(source: str, *, html: bool = False) -> str | None:
    """Why ``source`` does not compile (with its line), or None."""
    try:
        compile_template(source, html=html)
    except TemplateSyntaxError as exc:
        return f"line {exc.lineno}: {exc.message}"
    return None


def render(source: str, context: Mapping[str, Any], *, html: bool, where: str) -> str:
    """One template rendered with ``context`` within the current budget (a fresh one
    unless an event's is in force: ``sandbox.limited``); ``RenderError`` naming
    ``where``, the line and the cause when it cannot be (a template is the operator's
    code: any failure inside it is the template's)."""
    try:
        with sandbox.limited():
            return compile_template(source, html=html).render(context)
    except SecurityError as exc:
        raise RenderError(f"{where}{_line(exc)}: refused by the sandbox: {exc}") from None
    except UndefinedError as exc:  # names the variable
        field = _missing(exc)
        raise RenderError(
            f"{where}{_line(exc)}: {exc}", field=field, kind="missing" if field else "value_error"
        ) from None
    except TemplateError as exc:
        raise RenderError(f"{where}{_line(exc)}: {exc}") from None
    except Exception as exc:  # a filter given a bad value, a division by zero...
        raise RenderError(f"{where}{_line(exc)}: {type(exc).__name__}: {exc}") from None


def _line(exc: BaseException) -> str:
    """`` (line N)`` of the template where ``exc`` was raised, if a frame says."""
    line = None
    tb = exc.__traceback__ if exc.__traceback__ is not None else sys.exc_info()[2]
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == _SOURCE:
            line = tb.tb_lineno
        tb = tb.tb_next
    return "" if line is None else f" (line {line})"


# -- Babel's filters -------------------------------------------------------------------


def _locale(context: Context) -> str:
    own = context.get(RESERVED)
    found = own.get("format_locale") if isinstance(own, Mapping) else None
    return found if isinstance(found, str) else "en"


def _moment(value: Any) -> datetime:
    """A datetime from ISO-8601 text, epoch seconds or a datetime (naive: UTC)."""
    if isinstance(value, datetime):
        found = value
    elif isinstance(value, date):
        found = datetime(value.year, value.month, value.day)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, UTC)
    elif isinstance(value, str):
        try:
            found = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"{shown(value)} is not an ISO-8601 date or time") from None
    else:
        raise ValueError(f"{shown(value)} is not a date: give ISO-8601 text or epoch seconds")
    return found if found.tzinfo is not None else found.replace(tzinfo=UTC)


def _zone(tz: str | None) -> ZoneInfo | None:
    if tz is None:
        return None
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"{shown(tz)} is not an IANA time zone (such as 'Asia/Jakarta')") from None


def _in_zone(value: Any, tz: str | None) -> datetime:
    moment = _moment(value)
    zone = _zone(tz)
    return moment if zone is None else moment.astimezone(zone)


@pass_context
def _date(context: Context, value: Any, format: str = "medium", tz: str | None = None) -> str:
    """A date: ``format`` is short, medium, long, full or a Babel pattern."""
    if isinstance(value, date) and not isinstance(value, datetime):
        return babel_dates.format_date(value, format, locale=_locale(context))
    if isinstance(value, str) and len(value) == 10:  # a date alone: no time zone to apply
        try:
            day = date.fromisoformat(value)
        except ValueError:
            raise ValueError(f"{shown(value)} is not an ISO-8601 date or time") from None
        return babel_dates.format_date(day, format, locale=_locale(context))
    return babel_dates.format_date(_in_zone(value, tz).date(), format, locale=_locale(context))


@pass_context
def _datetime(context: Context, value: Any, format: str = "medium", tz: str | None = None) -> str:
    """A date and time, in ``tz`` (an IANA name) or the offset the value carries (UTC)."""
    moment = _in_zone(value, tz)
    return babel_dates.format_datetime(
        moment, format, tzinfo=moment.tzinfo, locale=_locale(context)
    )


@pass_context
def _time(context: Context, value: Any, format: str = "short", tz: str | None = None) -> str:
    """A time of day, in ``tz`` or the value's own offset."""
    if isinstance(value, time):
        return babel_dates.format_time(value, format, locale=_locale(context))
    moment = _in_zone(value, tz)
    return babel_dates.format_time(moment, format, tzinfo=moment.tzinfo, locale=_locale(context))


def _amount(value: Any) -> int | float | Decimal:
    """A number, or the text of one (``"1500000.50"``: exact, as money is written)."""
    if isinstance(value, int | float | Decimal) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            number = Decimal(value.strip())
        except InvalidOperation:
            pass
        else:
            if number.is_finite():
                return number
    raise ValueError(f"{shown(value)} is not a number")


@pass_context
def _number(context: Context, value: Any, format: str | None = None) -> str:
    """A number with the locale's separators (``format``: a Babel pattern)."""
    return babel_numbers.format_decimal(_amount(value), format, locale=_locale(context))


@pass_context
def _currency(context: Context, value: Any, currency: str, format: str | None = None) -> str:
    """An amount of ``currency`` (ISO 4217: IDR, EUR, USD), as the locale writes money."""
    return babel_numbers.format_currency(_amount(value), currency, format, locale=_locale(context))


@pass_context
def _percent(context: Context, value: Any, format: str | None = None) -> str:
    """A fraction as a percentage (0.25 -> 25%)."""
    return babel_numbers.format_percent(_amount(value), format, locale=_locale(context))
