"""``kirim serve``: the HTTP API, the dashboard and /metrics on uvicorn."""

from __future__ import annotations

import dataclasses
import signal
import socket
from typing import TYPE_CHECKING, Any

import click

from kirim.cli import runner
from kirim.cli.runner import EXIT_USAGE, State, pass_state
from kirim.config import Config, ServeSettings
from kirim.errors import ConfigError
from kirim.http.guard import loopback
from kirim.observe.logging import get_logger
from kirim.text import redact_url

if TYPE_CHECKING:
    import uvicorn


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (so that the port is known, even when it is 0)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"cannot resolve --host {host!r}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another --port"
        ) from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


@click.command()
@click.option("--host", metavar="HOST", help="Address to bind.  [default: 127.0.0.1]")
@click.option(
    "--port", type=click.IntRange(0, 65535), metavar="PORT", help="Port.  [default: 8000]"
)
@click.option(
    "--protect-metrics", is_flag=True, default=None, help="/metrics needs a bearer token too."
)
@click.option(
    "--protect-dashboard",
    is_flag=True,
    default=None,
    help="The dashboard needs a token (a login form sets a cookie).",
)
@click.option(
    "--token-cache",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    metavar="SECONDS",
    help="How long a verified token is remembered (a revoked one works that long).",
)
@pass_state
def serve(
    state: State,
    host: str | None,
    port: int | None,
    protect_metrics: bool | None,
    protect_dashboard: bool | None,
    token_cache: float,
) -> None:
    """Serve the HTTP API, the dashboard and Prometheus metrics.

    \b
    /v1/notifications          POST (Idempotency-Key), GET list, GET /{id},
                               GET /{id}/timeline, POST /{id}/cancel
    /v1/dead-letters           GET, POST /{id}/retry
    /v1/recipients/{id}/feed   the in-app inbox: GET, /counts, POST /{item}/read
                               (seen, unread, archive, unarchive), /mark, DELETE;
                               POST /v1/recipients/{id}/feed-token
    /healthz /readyz /metrics  liveness, database reachable, Prometheus text
    /openapi.json              the OpenAPI document
    /                          the dashboard

    Every /v1 route needs `Authorization: Bearer TOKEN` (`kirim token create`);
    a recipient's feed also takes its own feed token ([inbox] secret).
    Options not given come from the [serve] table of the config file. Binds
    127.0.0.1 unless told otherwise. SIGTERM or SIGINT stops it gracefully.
    Without --protect-dashboard the dashboard answers only the Host names of
    [serve] allowed_hosts (the loopback names by default), and retries or
    cancels only when the server is bound to loopback.

    \b
    Examples:
      kirim serve
      kirim serve --host 0.0.0.0 --port 8080 --protect-metrics --protect-dashboard
    """
    import uvicorn

    from kirim.http.app import create_app

    state.setup_logging("info")
    with runner.reported():
        config = with_flags(
            state.config(),
            host=host,
            port=port,
            protect_metrics=protect_metrics,
            protect_dashboard=protect_dashboard,
        )
    settings = config.serve

    async def check() -> None:  # a missing schema is one line, before anything listens
        async with state.app():
            pass

    runner.run(check)
    with runner.reported():
        sock = bind(settings.host, settings.port)
    log = get_logger(component="http")
    _warn_if_open(log, settings)
    app = create_app(config=config, settings=settings, token_cache=token_cache)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_config=None,
            log_level="warning",
            access_log=False,
            server_header=False,
            lifespan="on",
            timeout_graceful_shutdown=10,
        )
    )
    received = _catch(server)  # before "serving": a stop from then on is graceful
    _say_serving(log, sock, config)
    _run(server, sock, received)
    if received:
        log.info("stopped", signal=signal.Signals(received[0]).name)
    if not server.started:
        runner.fail("the server did not start; see the log above", EXIT_USAGE)


def with_flags(config: Config, **given: Any) -> Config:
    """``config`` with the flags that were given (not None) over its ``[serve]`` table."""
    settings = dataclasses.replace(
        config.serve, **{k: v for k, v in given.items() if v is not None}
    )
    return dataclasses.replace(config, serve=settings)


def _warn_if_open(log: Any, settings: ServeSettings) -> None:
    """Say so when an unprotected dashboard listens beyond loopback."""
    if not loopback(settings.host) and not settings.protect_dashboard:
        log.warning(
            "dashboard_unprotected",
            host=settings.host,
            allowed_hosts=",".join(settings.allowed_hosts),
            hint="anyone who reaches this address can read the dashboard (its Host must be "
            "in [serve] allowed_hosts); retry and cancel are refused: add --protect-dashboard",
        )


def _say_serving(log: Any, sock: socket.socket, config: Config) -> None:
    """The ``serving`` line: the address really bound (its port even when 0 was asked)."""
    bound = sock.getsockname()
    shown = f"[{bound[0]}]" if ":" in str(bound[0]) else str(bound[0])
    log.info(
        "serving",
        url=f"http://{shown}:{bound[1]}",
        database=redact_url(config.database),
        protect_metrics=config.serve.protect_metrics,
        protect_dashboard=config.serve.protect_dashboard,
        inbox_secret="set" if config.inbox.secret is not None else "none",
        feed_origins=",".join(config.inbox.allowed_origins) or "none",
    )


def _catch(server: uvicorn.Server) -> list[int]:
    """Note SIGTERM and SIGINT from now on, and stop ``server`` on them; the list fills
    with the signals received."""
    received: list[int] = []

    def stop(number: int, _: object) -> None:
        received.append(number)
        # A signal before uvicorn has put in its own handlers (a stop right after the
        # start) lands here: it must stop the server too, not only be noted.
        server.should_exit = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        # uvicorn shuts down gracefully, then raises the signal again for the handler it
        # found: this one notes it, so that a stop on request exits 0 (as the worker does)
        signal.signal(sig, stop)
    return received


def _run(
    server: uvicorn.Server, sock: socket.socket, received: list[int] | None = None
) -> list[int]:
    """Run ``server`` on ``sock`` until it stops; return the signals that stopped it
    (``received``: from ``_catch``, called before; else it is called here)."""
    if received is None:
        received = _catch(server)
    try:
        with runner.reported():
            server.run(sockets=[sock])  # uvloop and httptools when installed
    finally:
        sock.close()
    return received
