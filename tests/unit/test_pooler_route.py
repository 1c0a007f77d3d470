"""kirim.store.pooler: a pooler or proxy in front, told from the ports on both sides."""

from __future__ import annotations

import socket

import pytest

from kirim.store.pooler import Route, Wakeups, local_port, route


@pytest.mark.parametrize(
    ("local", "seen", "in_front"),
    [
        (50000, 50000, False),  # the server sees our own socket
        (50000, 41234, True),  # another connection: the pooler's
        (None, 41234, True),  # a Unix socket here, TCP at the server: something between
        (50000, None, True),  # TCP here, a Unix socket at the server
        (None, None, None),  # Unix sockets on both sides: cannot tell
    ],
)
def test_in_front_compares_the_ports(local, seen, in_front) -> None:
    """A route is direct when the server sees the port of our own socket."""
    assert Route(local_port=local, seen_port=seen).in_front is in_front


def test_route_reads_the_local_port_of_a_socket() -> None:
    """route() takes our socket's local port; the server's -1 or NULL is no port."""
    with socket.socket() as server, socket.socket() as client:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        client.connect(server.getsockname())
        port = client.getsockname()[1]
        assert local_port(client.fileno()) == port
        assert route(client.fileno(), port).in_front is False
        assert route(client.fileno(), -1) == Route(local_port=port, seen_port=None)
        assert route(client.fileno(), None).seen_port is None


def test_wakeups_warn_only_when_listen_goes_through_something() -> None:
    """The LISTEN route decides the warning, whatever the database's route."""
    pooled, direct = Route(local_port=1, seen_port=2), Route(local_port=3, seen_port=3)
    through = Wakeups(via="database", database=pooled, listen=pooled)
    aside = Wakeups(via="listen_url", database=pooled, listen=direct)
    assert through.pooled
    assert "listen_url" in (through.warning() or "")
    assert not aside.pooled
    assert aside.warning() is None
    assert aside.describe() == "LISTEN on listen_url"
    assert Wakeups(via="database").warning() is None  # not probed yet
