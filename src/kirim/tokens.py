"""API tokens of the HTTP service, and ``kirim token create|list|revoke``.

A token is ``kirim_`` and 43 random URL-safe characters (256 bits). The store keeps
only its sha256 (``kirim_tokens.token_hash``) and its first characters (``prefix``,
to recognise it in a list): the token itself is printed once, at creation, and
never stored nor logged.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from datetime import UTC, datetime
from typing import Any

import click

from kirim import cli_ops, cli_types
from kirim.cli_ops import State, pass_state
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


def token_json(token: ApiToken) -> dict[str, Any]:
    return {
        "id": token.id,
        "name": token.name,
        "prefix": token.prefix,
        "created_at": _iso(token.created_at),
        "revoked_at": _iso(token.revoked_at),
    }


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    moment = datetime.fromtimestamp(round(epoch, 3), UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


# -- the command line ------------------------------------------------------------------


@click.group(name="token")
def token() -> None:
    """Create, list or revoke the bearer tokens of `kirim serve`.

    Every /v1 route of the HTTP service needs `Authorization: Bearer TOKEN`. The
    database keeps only a token's sha256: the token is printed once, when created.

    \b
    Examples:
      kirim token create --name billing-service
      kirim token list --json
      kirim token revoke billing-service
    """


@token.command(name="create")
@click.option("--name", required=True, help="What the token is for (unique among active ones).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (with the token).")
@pass_state
def create_cmd(state: State, name: str, as_json: bool) -> None:
    """Create a token and print it, once, alone on the last line.

    \b
    Example:
      TOKEN=$(kirim token create --name ci | tail -n 1)
      curl -H "Authorization: Bearer $TOKEN" http://127.0.0.1:8000/v1/notifications
    """
    state.setup_logging()
    with cli_ops.reported():
        check_name(name)

    async def go() -> tuple[ApiToken, str]:
        async with state.app() as app:
            return await create_token(app.store, name, now=app.clock.now())

    record, secret = cli_ops.run(go)
    if as_json:
        cli_ops.emit_json({**token_json(record), "token": secret})
        return
    click.echo(f"token {record.name!r} created (id {record.id}); it is shown this once:")
    click.echo(secret)


@token.command(name="list")
@click.option("--all", "include_revoked", is_flag=True, help="Include revoked tokens.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@pass_state
def list_cmd(state: State, include_revoked: bool, as_json: bool) -> None:
    """List tokens (never the tokens themselves: their first characters).

    \b
    Example:
      kirim token list --all
    """
    state.setup_logging()

    async def go() -> list[ApiToken]:
        async with state.app() as app:
            return await app.store.list_tokens(include_revoked=include_revoked)

    tokens = cli_ops.run(go)
    if as_json:
        cli_ops.emit_json([token_json(t) for t in tokens])
        return
    if not tokens:
        click.echo("no tokens; create one with `kirim token create --name NAME`")
    for t in tokens:
        revoked = f"  revoked {_iso(t.revoked_at)}" if t.revoked_at is not None else ""
        click.echo(f"{t.id}\t{t.name}\t{t.prefix}…\tcreated {_iso(t.created_at)}{revoked}")


@token.command(name="revoke")
@click.argument("name_or_id", type=cli_types.TextParam())
@pass_state
def revoke_cmd(state: State, name_or_id: str) -> None:
    """Revoke the active token with this name (or id). Exits 1 when there is none.

    A server stops accepting it within a second (see `kirim serve --help`).

    \b
    Example:
      kirim token revoke billing-service
    """
    state.setup_logging()

    async def go() -> ApiToken | None:
        async with state.app() as app:
            return await app.store.revoke_token(name_or_id, now=app.clock.now())

    revoked = cli_ops.run(go)
    if revoked is None:
        cli_ops.fail(
            f"no active token named {name_or_id!r} (or with that id); see `kirim token list`"
        )
    click.echo(f"token {revoked.name!r} (id {revoked.id}) revoked")
