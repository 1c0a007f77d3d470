"""``kirim token create|list|revoke``: the HTTP service's API tokens (``kirim.tokens``)."""

from __future__ import annotations

import click

from kirim.cli import params, render, runner
from kirim.cli.runner import State, pass_state
from kirim.store.base import ApiToken
from kirim.tokens import check_name, create_token
from kirim.views import iso, token_json

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
    with runner.reported():
        check_name(name)

    async def go() -> tuple[ApiToken, str]:
        async with state.app() as app:
            return await create_token(app.store, name, now=app.clock.now())

    record, secret = runner.run(go)
    if as_json:
        render.emit_json({**token_json(record), "token": secret})
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

    tokens = runner.run(go)
    if as_json:
        render.emit_json([token_json(t) for t in tokens])
        return
    if not tokens:
        click.echo("no tokens; create one with `kirim token create --name NAME`")
    for t in tokens:
        revoked = f"  revoked {iso(t.revoked_at)}" if t.revoked_at is not None else ""
        click.echo(f"{t.id}\t{t.name}\t{t.prefix}…\tcreated {iso(t.created_at)}{revoked}")


@token.command(name="revoke")
@click.argument("name_or_id", type=params.TextParam())
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

    revoked = runner.run(go)
    if revoked is None:
        runner.fail(
            f"no active token named {name_or_id!r} (or with that id); see `kirim token list`"
        )
    click.echo(f"token {revoked.name!r} (id {revoked.id}) revoked")
