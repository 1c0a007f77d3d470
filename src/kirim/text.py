"""Text from outside made fit for where it goes: the ledger (a provider's answer, an
exception), a terminal, a log line or a page (control characters escaped), and URLs
fit to print (secrets redacted).

One escaping of control characters serves every text sink: the log formats
(``kirim.observe.logging``), the CLI's tables and JSON (``kirim.cli.render``), the
dashboard and the API's JSON (``kirim.http``), timelines and ``kirim analyze``'s
reports. A control character is written as Python writes it in a string literal
(``\\r``, ``\\x1b``, ``\\u2028``), so no input can end a log line, move a cursor,
set a terminal's title or reorder what is shown.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from kirim.limits import MESSAGE_ID, PROVIDER_TEXT, cut

#: Longest provider or error text kept in a ledger column, in bytes of UTF-8.
MAX_TEXT = PROVIDER_TEXT.bytes

#: What no sink shows raw: C0 controls, DEL, C1 controls (NEL, CSI...), the line and
#: paragraph separators, the bidirectional embeddings, overrides and isolates, and
#: lone surrogates (which no terminal or file can encode).
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
#: the same, less the C0 controls, which JSON itself always escapes
_JSON_RAW = re.compile("[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_char(char: str) -> str:
    """One control character as an escape: ``\\n``, ``\\r``, ``\\t``, else ``\\xHH`` or
    ``\\uHHHH``."""
    short = _SHORT.get(char)
    if short is not None:
        return short
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str) -> str:
    """``text`` with every control character escaped (``escape_char``); the rest as it is.
    For people's eyes: a terminal, a table cell, a page."""
    if CONTROL.search(text) is None:
        return text
    return CONTROL.sub(lambda m: escape_char(m.group()), text)


def first_control(text: str) -> str | None:
    """The first control character in ``text`` (as ``CONTROL`` has them), or None."""
    found = CONTROL.search(text)
    return None if found is None else found.group()


def json_text(data: Any, **options: Any) -> str:
    """``data`` as JSON with non-ASCII text kept as it is, except the characters no sink
    shows raw (DEL, C1, separators, bidirectional controls, lone surrogates), written as
    ``\\u`` escapes: the same JSON value, safe on a terminal and encodable as UTF-8."""
    text = json.dumps(data, ensure_ascii=False, **options)
    if _JSON_RAW.search(text) is None:
        return text
    return _JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def stored_text(value: str | None, *, limit: int = MAX_TEXT) -> str | None:
    """``value`` as every backend stores it: no NUL (PostgreSQL text refuses it), no
    lone surrogate (UTF-8 cannot encode it), at most ``limit`` bytes of UTF-8 (cut
    between two characters, with ``…`` after what is kept)."""
    if value is None:
        return None
    if value.isascii() and len(value) <= limit and "\x00" not in value:
        return value  # the common case (a message id): nothing to replace nor to cut
    clean = value.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")
    return cut(clean, limit)


def stored_message_id(value: str | None) -> str | None:
    """A provider's message id as the ledger keeps it (``stored_text`` within
    ``kirim.limits.MESSAGE_ID``, the limit its indexes hold)."""
    return stored_text(value, limit=MESSAGE_ID.bytes)


# -- URLs ------------------------------------------------------------------------------

#: Names of log fields whose values are never written (``kirim.observe.logging``); a
#: field whose name ends with ``_token``, ``_secret`` or ``_password`` neither.
SECRET_FIELDS = frozenset(
    {"token", "authorization", "password", "secret", "api_key", "apikey", "credentials"}
    | {"private_key", "vapid_private_key", "service_account"}
)
_FIELD_ENDINGS = ("_token", "_secret", "_password")
#: ... and of URL query parameters, which also name keys and signatures
_QUERY_NAMES = SECRET_FIELDS | {
    "passwd",
    "pass",
    "pwd",
    "sslpassword",
    "key",
    "access_key",
    "api-key",
    "auth",
    "sig",
    "signature",
    "access_token",
}
_QUERY_ENDINGS = (*_FIELD_ENDINGS, "_key", "-key", "-token", "-secret")


def secret_field(name: str) -> bool:
    """Whether a log field named ``name`` holds a secret."""
    lowered = name.lower()
    return lowered in SECRET_FIELDS or lowered.endswith(_FIELD_ENDINGS)


def secret_parameter(name: str) -> bool:
    """Whether a URL query parameter named ``name`` holds a secret."""
    lowered = name.lower()
    return lowered in _QUERY_NAMES or lowered.endswith(_QUERY_ENDINGS)


def redact_url(url: str) -> str:
    """The URL without its secrets, fit to print or log: the password of its user
    (``user:***@host``) and the value of every secret-looking query parameter
    (``?password=***``, ``?api_key=***``). The one redaction of database and endpoint
    URLs; the rest of the URL is kept as written (``postgresql:///db?host=/run``)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # not a URL at all (a bad port...): its scheme only
        scheme = url.partition(":")[0]
        return f"{scheme}:***" if scheme.isalnum() else "***"
    netloc = parts.netloc
    if password is not None:
        netloc = f"{parts.username or ''}:***@{netloc.rpartition('@')[2]}"
    query = _redact_query(parts.query)
    if netloc == parts.netloc and query == parts.query:
        return url
    out = f"{parts.scheme}:" if parts.scheme else ""
    if url[len(out) :].startswith("//"):
        out += "//" + netloc
    out += parts.path
    if parts.query:
        out += "?" + query
    if parts.fragment:
        out += "#" + parts.fragment
    return out


def url_secrets(url: str) -> list[str]:
    """The secrets a URL holds (its password, its secret-looking parameters' values),
    longest first."""
    try:
        parts = urlsplit(url)
        found = [parts.password] if parts.password else []
    except ValueError:
        return []
    for pair in parts.query.split("&"):
        name, sep, value = pair.partition("=")
        if sep and value and secret_parameter(unquote(name)):
            found += [value, unquote(value)]
    return sorted({s for s in found if s}, key=len, reverse=True)


def scrub(message: str, url: str) -> str:
    """``message`` (a driver's error about ``url``) with every secret of ``url`` written
    ``***``: a driver may quote the parameter it could not read."""
    for secret in url_secrets(url):
        message = message.replace(secret, "***")
    return message


def _redact_query(query: str) -> str:
    if not query:
        return query
    out = []
    for pair in query.split("&"):
        name, sep, _ = pair.partition("=")
        out.append(f"{name}=***" if sep and secret_parameter(unquote(name)) else pair)
    return "&".join(out)


def libpq_query(query: str) -> list[tuple[str, str]]:
    """The parameters of a libpq URI's query as libpq reads them: split on ``&`` and
    the first ``=``, percent-decoded (``+`` is a plus, not a space)."""
    pairs = []
    for pair in query.split("&"):
        if not pair:
            continue
        name, _, value = pair.partition("=")
        pairs.append((unquote(name), unquote(value)))
    return pairs


def libpq_encode(pairs: list[tuple[str, str]]) -> str:
    """``libpq_query``'s inverse: each name and value percent-encoded."""
    return "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in pairs)


def plural(n: int, word: str, many: str | None = None) -> str:
    """``n`` and ``word`` in its number, thousands separated: ``1 delivery``, ``3
    deliveries``, ``2 requests``, ``1,204 keys``. ``many``: the plural when the rule
    (a consonant and ``y`` make ``ies``, else ``s``) does not give it."""
    if n == 1:
        return f"1 {word}"
    if many is None:
        irregular = word.endswith("y") and word[-2:-1] not in ("a", "e", "i", "o", "u", "")
        many = word[:-1] + "ies" if irregular else word + "s"
    return f"{n:,} {many}"
