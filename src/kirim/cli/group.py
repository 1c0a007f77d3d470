"""The ``kirim`` command line: the group, its options, and the commands of each family
(``deliveries``, ``dead_letters``, ``work``, ``setup``; ``doctor``, ``prune``, ``serve``,
``token``, ``analyze`` and ``simulate`` are loaded only when used).

Every command reads the configuration (``--config``, else ``./kirim.toml`` if it
exists), opens the store named by ``--database`` (else ``KIRIM_DATABASE_URL``, else
the config file, else ``sqlite:///kirim.db``) and checks its schema. Results go to
stdout (text, or JSON with ``--json``); logs and error messages go to stderr.

Exit status: 0 success, 1 a failed check or a missing record, 2 a usage or
configuration error. Errors are one line on stderr saying what to fix.
"""

from __future__ import annotations

import click

from kirim.cli import dead_letters, deliveries, params, setup, work
from kirim.cli.runner import KirimGroup, State

# -- the group -------------------------------------------------------------------------


@click.group(cls=KirimGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "config_path",
    type=params.PathParam(dir_okay=False),
    metavar="FILE",
    help="Configuration file.  [default: ./kirim.toml if it exists]",
)
@click.option(
    "--database",
    metavar="URL",
    help="Database URL; overrides KIRIM_DATABASE_URL and the config file.  "
    "[default: sqlite:///kirim.db]",
)
@click.option(
    "--log-format",
    type=click.Choice(["logfmt", "json"]),
    default="logfmt",
    show_default=True,
    help="Format of the log lines written to stderr.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    help="Log level.  [default: info for the worker, warning for other commands]",
)
@click.version_option(package_name="kirim", prog_name="kirim")
@click.pass_context
def main(
    ctx: click.Context,
    config_path: str | None,
    database: str | None,
    log_format: str,
    log_level: str | None,
) -> None:
    """kirim: notification delivery that never sends the same notification twice.

    \b
    A first run (kirim init writes a kirim.toml whose channel push posts to
    the test receiver that python -m kirim.receiver runs on 127.0.0.1:8080):
      kirim init
      python -m kirim.receiver &
      kirim send --event order-48291 --recipient 1007 --channel push \\
                 --payload '{"title": "Your order has shipped"}'
      kirim worker --burst
      kirim list --status sent
    """
    ctx.obj = State(
        config_path=config_path, database=database, log_format=log_format, log_level=log_level
    )
    # The CLI owns the output: logs on stderr (commands that say more set it again).
    ctx.obj.setup_logging()


# `kirim simulate` lives in kirim.simulate and is imported only when used.
KirimGroup.lazy = {**KirimGroup.lazy, "simulate": ("kirim.simulate.command", "simulate")}
# `kirim doctor` lives in kirim.cli.doctor and is imported only when used.
KirimGroup.lazy = {**KirimGroup.lazy, "doctor": ("kirim.cli.doctor", "doctor")}
# `kirim prune` (retention) lives in kirim.cli.prune and is imported only when used.
KirimGroup.lazy = {**KirimGroup.lazy, "prune": ("kirim.cli.prune", "prune")}
# `kirim serve` (kirim.http, FastAPI) and `kirim token` are imported only when used.
KirimGroup.lazy = {
    **KirimGroup.lazy,
    "serve": ("kirim.cli.serve", "serve"),
    "token": ("kirim.cli.tokens", "token"),
    # `kirim prefs`: recipients' preferences
    "prefs": ("kirim.cli.prefs", "prefs"),
    # `kirim topics`: topics and their subscribers (kirim.topics)
    "topics": ("kirim.cli.topics", "topics"),
    # `kirim addresses`: recipients' addresses (device tokens, phones, subscriptions)
    "addresses": ("kirim.cli.addresses", "addresses"),
    # `kirim explore` (its module imports kirim.cli: loaded after the group)
    "explore": ("kirim.explore.command", "explore"),
    # `kirim render` (notification types' templates, kirim.notify)
    "render": ("kirim.cli.events", "render"),
    # `kirim event`: one event of a type for its recipients (Kirim.notify_event)
    "event": ("kirim.cli.events", "event"),
    # `kirim migrate`: the schema's migrations, or what they would do
    "migrate": ("kirim.cli.migrate", "migrate"),
    # `kirim import-keys`: another system's sent keys as tombstones (docs/adopting.md)
    "import-keys": ("kirim.cli.import_keys", "import_keys"),
    # `kirim run`: workflow runs as their steps on one timeline (docs/workflows.md)
    "run": ("kirim.cli.runs", "run"),
}


# -- the commands, one module per family -----------------------------------------------

for command in (
    setup.init,
    deliveries.send,
    work.worker,
    deliveries.status,
    deliveries.list_,
    dead_letters.dead_letter,
    deliveries.cancel,
    deliveries.reconcile,
    setup.demo,
    setup.bench,
):
    main.add_command(command)
