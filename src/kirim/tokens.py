"""API tokens of the HTTP service: minting, hashing, naming.

A token is ``kirim_`` and 43 random URL-safe characters (256 bits). The store keeps
only its sha256 (``kirim_tokens.token_hash``) and its first characters (``prefix``,
to recognise it in a list): the token itself is printed once, at creation, and
never stored nor logged. The commands are ``kirim.cli.tokens``.
"""

from __future__ import annotations

import hashlib
import re
import secrets

from kirim.errors import ConfigError
from kirim.store.base import ApiToken, Tokens

TOKEN_PREFIX = "kirim_"
#: characters of a token kept in clear (``kirim_`` and four random ones)
SHOWN = len(TOKEN_PREFIX) + 4
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")


def new_secret() -> str:
    """A fresh token: 256 random bits."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """What the store keeps of a token: its sha256, in hex."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def check_name(name: str) -> str:
    """A token name: 1-64 letters, digits, ``_.@-``, starting with a letter or digit,
    and not only digits (so that NAME_OR_ID is never ambiguous)."""
    if not _NAME.fullmatch(name) or name.isdigit():
        raise ConfigError(
            f"token name {name!r}: use 1-64 letters, digits, '_', '.', '@' or '-', "
            "starting with a letter or digit, not only digits"
        )
    return name


async def create_token(store: Tokens, name: str, *, now: float) -> tuple[ApiToken, str]:
    """Create a token named ``name``: its record and the secret (shown once)."""
    check_name(name)
    secret = new_secret()
    token = await store.create_token(name, hash_token(secret), prefix=secret[:SHOWN], now=now)
    if token is None:
        raise ConfigError(
            f"a token named {name!r} already exists; revoke it first or choose another name"
        )
    return token, secret
