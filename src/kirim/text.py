"""Text from outside (a provider's answer, an exception) made fit for the ledger, and
URLs made fit to print."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

#: Longest provider or error text kept in a ledger column.
MAX_TEXT = 1000


def stored_text(value: str | None, *, limit: int = MAX_TEXT) -> str | None:
    """``value`` as every backend stores it: no NUL (PostgreSQL text refuses it), no
    lone surrogate (UTF-8 cannot encode it), at most ``limit`` characters."""
    if value is None:
        return None
    clean = value.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")
    if len(clean) > limit:
        clean = clean[: limit - 1] + "…"
    return clean


def redact_url(url: str) -> str:
    """The URL without its password (``user:***@host``), fit to print or log: the one
    redaction of database and endpoint URLs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


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
