"""Turn one log line (logfmt or JSON) into a dict of kirim's canonical field names.

Input may be kirim's own logs or the seed write-up's pseudo-log vocabulary
(``worker=A action=provider_request request_id=req-abc`` …); both are mapped onto the
same canonical names so the detector sees one shape.  The logfmt path is the hot path:
a ``str.split`` + ``str.partition`` loop, with a regex only for lines holding quotes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Final

Record = dict[str, str]

#: Canonical field names understood by the analyzer (targets of ``--field``).
FIELDS: Final = frozenset(
    {
        "ts",
        "level",
        "event",
        "notification_id",
        "event_id",
        "job_id",
        "attempt",
        "worker_id",
        "idempotency_key",
        "provider_request_id",
        "provider_message_id",
        "result",
        "status",
        "latency_s",
        "error",
    }
)

#: The seed's vocabulary (and common logger defaults) → canonical names.
DEFAULT_ALIASES: Final[Mapping[str, str]] = {
    "worker": "worker_id",
    "request_id": "provider_request_id",
    "provider_msg_id": "provider_message_id",
    "action": "event",
    "timestamp": "ts",
    "time": "ts",
    "@timestamp": "ts",
}

#: kirim's event names; as a bare word (``db_update``) they name the line's event.
EVENTS: Final = frozenset(
    {
        "enqueued",
        "job_claimed",
        "provider_request",
        "provider_response",
        "db_update",
        "lease_expired",
        "claim_lost",
        "stale_write_rejected",
        "noop_already_sent",
        "in_doubt",
        "retry_scheduled",
        "dead_lettered",
    }
)

#: ``status=…`` values that name an event when a line has no explicit event.
_STATUS_EVENTS: Final[Mapping[str, str]] = {
    "start": "job_claimed",
    "started": "job_claimed",
    "claimed": "job_claimed",
    "lease_expired": "lease_expired",
    "claim_lost": "claim_lost",
    "retry_scheduled": "retry_scheduled",
    "dead_lettered": "dead_lettered",
}
#: Delivery statuses: ``status=sent`` alone on a line is a status write.
_WRITE_STATUSES: Final = frozenset(
    {"sent", "confirmed", "delivered", "failed", "pending", "processing", "canceled", "in_doubt"}
)
_EVENT_ALIASES: Final[Mapping[str, str]] = {
    "start": "job_claimed",
    "started": "job_claimed",
    "claimed": "job_claimed",
    "job_started": "job_claimed",
    "request": "provider_request",
    "response": "provider_response",
    "status_update": "db_update",
}

#: a line's fields are separated by spaces (or tabs), never by another control
#: character: kirim writes those escaped, so a raw one belongs to the value it is in
_QUOTED_RE: Final = re.compile(r'([^ \t="]+)=("(?:[^"\\]|\\.)*"|[^ \t]*)|([^ \t]+)')
_ESCAPE_RE: Final = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)")
_ESCAPES: Final[Mapping[str, str]] = {"n": "\n", "t": "\t", "r": "\r"}
_MINUTES: dict[str, float] = {}
#: the lines of ``kirim worker``'s start banner (``kirim.cli.render.show_banner``), which
#: share its stderr with the log: known, not malformed
_BANNER: Final = re.compile(
    r"kirim .+ worker .+ \(pid \d+(?:, burst)?\)"
    r"|  (?:database|config|lease|concurrency|channels|wake-ups|metrics) +\S.*"
    r"| {15}\S[^=]*: .*; in doubt: .*"
)


def is_banner(line: str) -> bool:
    """Whether ``line`` is one of the worker's banner lines (not a log line)."""
    return _BANNER.fullmatch(line.rstrip("\r\n")) is not None


def _unescape(match: re.Match[str]) -> str:
    """One escape of a quoted value, as ``kirim.observe.logging.logfmt_value`` writes
    them: ``\\n``, ``\\t``, ``\\r``, ``\\xHH``, ``\\uHHHH``, ``\\UHHHHHHHH``; any
    other escaped character stands for itself."""
    char = match.group(1)
    if len(char) > 1:
        return chr(int(char[1:], 16))
    return _ESCAPES.get(char, char)


def parse_ts(value: str) -> float | None:
    """Parse an ISO-8601 timestamp (``Z`` or offset) or float epoch seconds to epoch seconds."""
    if len(value) >= 20 and value[-1] == "Z" and value[13] == ":" and value[16] == ":":
        # Fast path for kirim's fixed ``YYYY-MM-DDTHH:MM:SS.fffZ``: cache each minute's epoch.
        minute = value[:16]
        base = _MINUTES.get(minute)
        if base is None:
            try:
                base = datetime.fromisoformat(minute + ":00+00:00").timestamp()
            except ValueError:
                return None
            if len(_MINUTES) > 100_000:
                _MINUTES.clear()
            _MINUTES[minute] = base
        try:
            return base + float(value[17:-1])
        except ValueError:
            return None
    if not value:
        return None
    if value[0].isdigit() and "-" not in value and ":" not in value:
        try:
            epoch = float(value)
        except ValueError:
            return None
        return epoch / 1000.0 if epoch > 1e11 else epoch
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def parse_field_map(specs: Mapping[str, str] | list[str] | tuple[str, ...]) -> dict[str, str]:
    """Turn ``canonical=theirs`` specs (or a mapping) into ``{canonical: theirs}``."""
    if isinstance(specs, Mapping):
        pairs = list(specs.items())
    else:
        pairs = []
        for spec in specs:
            canonical, sep, theirs = spec.partition("=")
            if not sep or not canonical.strip() or not theirs.strip():
                raise ValueError(f"expected CANONICAL=THEIRS, got {spec!r}")
            pairs.append((canonical.strip(), theirs.strip()))
    for canonical, _theirs in pairs:
        if canonical not in FIELDS:
            known = ", ".join(sorted(FIELDS))
            raise ValueError(f"unknown field {canonical!r} (known: {known})")
    return dict(pairs)


class LineParser:
    """Parse lines into canonical records; ``None`` marks a malformed line."""

    __slots__ = ("_keymap",)

    def __init__(self, field_map: Mapping[str, str] | None = None) -> None:
        keymap = {name: name for name in FIELDS}
        keymap.update(DEFAULT_ALIASES)
        for canonical, theirs in parse_field_map(field_map or {}).items():
            keymap[theirs] = canonical
        self._keymap: dict[str, str] = keymap

    def parse(self, line: str) -> Record | None:
        """Return the canonical fields of ``line``, ``{}`` if none apply (a blank line,
        the worker's banner), ``None`` if malformed. A field named twice is the first
        (kirim writes ``ts``, ``level`` and ``event`` first: nothing later in the line
        replaces them)."""
        if not line.isascii():
            try:
                line.encode("utf-8")
            except UnicodeEncodeError:
                return None  # undecodable bytes (read with surrogateescape)
        if "\x00" in line:
            return None
        line = line.rstrip("\r\n")
        head = line[:1]
        if head in ("k", " ", "") and (not line.strip() or is_banner(line)):
            return {}  # a blank line, or the worker's banner: no event, not malformed
        if head == "{" or (head in " \t" and line.lstrip().startswith("{")):
            return self._parse_json(line)
        if "=" not in line:
            return None
        keymap = self._keymap
        rec: Record = {}
        word: str | None = None
        stamp: str | None = None
        if '"' in line:
            for key, value, bare in _QUOTED_RE.findall(line):
                if bare:
                    if bare in EVENTS:
                        word = bare
                    elif stamp is None and bare[0].isdigit() and len(bare) >= 10:
                        stamp = bare
                    continue
                if value[:1] == '"' and len(value) >= 2:
                    value = _ESCAPE_RE.sub(_unescape, value[1:-1])
                canonical = keymap.get(key)
                if canonical is not None and value and canonical not in rec:
                    rec[canonical] = value
        else:
            if "\t" in line:
                line = line.replace("\t", " ")
            for token in line.split(" "):
                if not token:
                    continue
                key, sep, value = token.partition("=")
                if sep:
                    canonical = keymap.get(key)
                    if canonical is not None and value and canonical not in rec:
                        rec[canonical] = value
                elif token in EVENTS:
                    word = token
                elif stamp is None and token[0].isdigit() and len(token) >= 10:
                    stamp = token
        if stamp is not None and "ts" not in rec:
            rec["ts"] = stamp
        if word is None and rec.get("event") in EVENTS:
            return rec  # the common case: kirim's own line, nothing to normalize
        return _normalize(rec, word)

    def _parse_json(self, line: str) -> Record | None:
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):  # nested too deeply: not a log line
            return None
        if not isinstance(obj, dict):
            return None
        keymap = self._keymap
        rec: Record = {}
        for key, value in obj.items():
            canonical = keymap.get(key)
            if canonical is None or value is None or value == "":
                continue
            if isinstance(value, str):
                rec[canonical] = value
            elif isinstance(value, bool):
                rec[canonical] = "true" if value else "false"
            elif isinstance(value, int | float):
                rec[canonical] = str(value)
        return _normalize(rec, None)


def _normalize(rec: Record, word: str | None) -> Record:
    event = rec.get("event")
    if event is not None:
        alias = _EVENT_ALIASES.get(event)
        if alias is not None:
            rec["event"] = alias
        return rec
    if word is not None:
        rec["event"] = word
        return rec
    status = rec.get("status")
    if status is not None:
        named = _STATUS_EVENTS.get(status)
        if named is not None:
            rec["event"] = named
            del rec["status"]
        elif status in _WRITE_STATUSES:
            rec["event"] = "db_update"
    return rec
