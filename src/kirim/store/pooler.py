"""Whether a connection pooler (PgBouncer, …) or a proxy sits between kirim and PostgreSQL.

The server's view of its client's TCP port (``inet_client_port()``) is compared with
the local port of our own socket: through a pooler or a proxy the server sees the
connection that the pooler opened, from another port (or another kind of socket).
NAT that keeps the source port (a Docker port mapping) is no pooler and is not
taken for one; what is in front cannot be told apart (PgBouncer in transaction or
session mode, a TCP proxy), so the result says "something", and what it costs.

kirim's store keeps nothing in a session, so its transactions work through any of
them. LISTEN does not: a pooler in transaction mode runs it on some server
connection that goes back to the pool, and no wake-up reaches the worker, which then
polls (every ``poll_interval``). ``listen_url`` gives LISTEN a direct connection.
"""

from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass

#: the server's view of this session's client port (NULL over a Unix socket)
CLIENT_PORT = "SELECT inet_client_port() AS port"


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    """How one connection reaches the server: our socket's local port, and the client
    port the server sees (None: a Unix socket, on either side)."""

    local_port: int | None
    seen_port: int | None

    @property
    def in_front(self) -> bool | None:
        """True: something sits between; False: a direct connection; None: cannot tell
        (a Unix socket on both sides)."""
        if self.local_port is None and self.seen_port is None:
            return None
        return self.local_port != self.seen_port

    def describe(self) -> str:
        """The evidence, in words."""
        ours = "a Unix socket" if self.local_port is None else f"local port {self.local_port}"
        seen = "a Unix socket" if self.seen_port is None else f"client port {self.seen_port}"
        return f"this host connected from {ours}, the server sees {seen}"


def local_port(fd: int) -> int | None:
    """The local TCP port of the socket ``fd`` (None: not a TCP socket)."""
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            name = sock.getsockname()
    except OSError:
        return None
    if isinstance(name, tuple) and len(name) >= 2 and isinstance(name[1], int):
        return name[1]
    return None


def route(fd: int, seen: object) -> Route:
    """The ``Route`` of a connection whose socket is ``fd``, the server having answered
    ``CLIENT_PORT`` with ``seen`` (-1 or NULL over a Unix socket)."""
    port = None
    with contextlib.suppress(TypeError, ValueError):
        port = int(seen) if seen is not None else None  # type: ignore[call-overload]
    return Route(local_port=local_port(fd), seen_port=port if port and port > 0 else None)


@dataclass(frozen=True, slots=True, kw_only=True)
class Wakeups:
    """Where a store's workers LISTEN: on the database's own URL or on ``listen_url``,
    and the routes found when the store opened (None: not probed)."""

    via: str  # "database" or "listen_url"
    database: Route | None = None
    listen: Route | None = None

    @property
    def pooled(self) -> bool:
        """Whether LISTEN goes through a pooler or proxy (its wake-ups may never come)."""
        return bool(self.listen is not None and self.listen.in_front)

    def describe(self) -> str:
        where = "listen_url" if self.via == "listen_url" else "the database connection"
        if self.pooled:
            return f"LISTEN on {where}, through a pooler or proxy (polling if none arrive)"
        return f"LISTEN on {where}"

    def warning(self) -> str | None:
        """What to say when LISTEN goes through something (None: nothing to say)."""
        if not self.pooled:
            return None
        assert self.listen is not None
        return (
            f"LISTEN goes through a pooler or proxy ({self.listen.describe()}): through a "
            "pooler in transaction mode no wake-up reaches the workers, which then poll "
            "every poll_interval; set listen_url to a direct connection to the server"
        )
