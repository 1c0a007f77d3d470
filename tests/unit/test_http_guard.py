"""The dashboard cannot be driven from another site: the Host allow-list (DNS
rebinding), write actions only with a token or on loopback, no framing."""

from __future__ import annotations

import pytest

from http_kit import BODY, Api, api_on
from kirim.config import ServeSettings
from kirim.http.guard import host_allowed, host_name, loopback
from kirim.testing import FlakyProvider
from kirim.worker import WorkerSettings

ANON = {"Authorization": ""}
#: a page of evil.example whose name now resolves to 127.0.0.1: its own Host and Origin
REBOUND = {"Host": "evil.example:8000", "Origin": "http://evil.example:8000", **ANON}
LOCAL = {"Host": "127.0.0.1:8000", "Origin": "http://127.0.0.1:8000", **ANON}


async def dead_letter(api: Api) -> int:
    """A notification whose job is dead (the provider refused it)."""
    created = (await api.post(BODY)).json()
    await api.kirim.worker(settings=WorkerSettings(lease=10), worker_id="A").run_once()
    return int(created["id"])


async def status_of(api: Api, delivery_id: int) -> str:
    status: str = (await api.client.get(f"/v1/notifications/{delivery_id}")).json()["status"]
    return status


@pytest.fixture
async def api(make_app):
    kirim = await make_app(FlakyProvider(script=["permanent"]))
    async with api_on(kirim) as found:
        yield found


async def test_a_rebound_host_cannot_cancel_or_read(api: Api) -> None:
    """Unprotected on loopback, a request naming another Host (with a matching Origin)
    is refused on every dashboard page and changes nothing."""
    dead = await dead_letter(api)
    for path in ("/", f"/dashboard/notifications/{dead}"):
        page = await api.client.get(path, headers=REBOUND)
        assert page.status_code == 403, path
        assert "allowed_hosts" in page.text
    for action in ("cancel", "retry"):
        refused = await api.client.post(
            f"/dashboard/notifications/{dead}/{action}", headers=REBOUND
        )
        assert refused.status_code == 403
    assert await status_of(api, dead) == "failed"
    no_host = await api.client.get("/", headers={"Host": "", **ANON})
    assert no_host.status_code == 403


async def test_loopback_names_are_allowed_by_default(api: Api) -> None:
    """127.0.0.1, localhost and [::1], any port, may read and cancel."""
    dead = await dead_letter(api)
    for host in ("localhost", "LOCALHOST:80", "[::1]:8000"):
        assert (await api.client.get("/", headers={"Host": host, **ANON})).status_code == 200
    done = await api.client.post(f"/dashboard/notifications/{dead}/cancel", headers=LOCAL)
    assert done.status_code == 303
    assert await status_of(api, dead) == "canceled"


async def test_beyond_loopback_an_unprotected_dashboard_is_read_only(make_app) -> None:
    """Bound to 0.0.0.0 without a token: its allowed Host may read, with no buttons,
    and retry or cancel is refused."""
    kirim = await make_app(FlakyProvider(script=["permanent"]))
    settings = ServeSettings(host="0.0.0.0", allowed_hosts=("kirim.internal",))
    headers = {"Host": "kirim.internal:8000", "Origin": "http://kirim.internal:8000", **ANON}
    async with api_on(kirim, settings=settings) as api:
        dead = await dead_letter(api)
        page = await api.client.get(f"/dashboard/notifications/{dead}", headers=headers)
        assert page.status_code == 200
        assert "/retry" not in page.text
        assert "/cancel" not in page.text
        refused = await api.client.post(f"/dashboard/notifications/{dead}/retry", headers=headers)
        assert refused.status_code == 403
        assert "--protect-dashboard" in refused.text
        assert await status_of(api, dead) == "failed"
        assert (await api.client.get("/", headers=LOCAL)).status_code == 403


async def test_a_token_lets_a_dashboard_write_under_any_host(make_app) -> None:
    """Protected by a token, the dashboard retries on 0.0.0.0 under its own name: a
    rebinding page has no token to send."""
    kirim = await make_app(FlakyProvider(script=["permanent"]))
    settings = ServeSettings(host="0.0.0.0", protect_dashboard=True)
    async with api_on(kirim, settings=settings) as api:
        dead = await dead_letter(api)
        same = {"Host": "kirim.example.com", "Origin": "http://kirim.example.com"}
        done = await api.client.post(f"/dashboard/notifications/{dead}/retry", headers=same)
        assert done.status_code == 303
        assert await status_of(api, dead) == "pending"
        anonymous = await api.client.post(
            f"/dashboard/notifications/{dead}/cancel", headers={**same, **ANON}
        )
        assert anonymous.status_code == 303
        assert anonymous.headers["location"].startswith("/dashboard/login")
        assert await status_of(api, dead) == "pending"


async def test_no_dashboard_response_may_be_framed(api: Api) -> None:
    """Every response, page, redirect, refusal or error, forbids framing."""
    dead = await dead_letter(api)
    responses = [
        await api.client.get("/", headers=LOCAL),
        await api.client.get(f"/dashboard/notifications/{dead}", headers=LOCAL),
        await api.client.get("/dashboard/notifications/999", headers=LOCAL),
        await api.client.get("/dashboard/login", headers=LOCAL),
        await api.client.get("/static/dashboard.css", headers=LOCAL),
        await api.client.post(f"/dashboard/notifications/{dead}/retry", headers=LOCAL),
        await api.client.get("/", headers=REBOUND),
        await api.client.get("/v1/notifications"),
    ]
    assert [r.status_code for r in responses] == [200, 200, 404, 200, 200, 303, 403, 200]
    for response in responses:
        assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
        assert response.headers["x-frame-options"] == "DENY"


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("127.0.0.1:8000", "127.0.0.1"),
        ("LocalHost", "localhost"),
        ("[::1]:8000", "::1"),
        ("[::1]", "::1"),
        ("::1", "::1"),
        ("evil.example:80", "evil.example"),
        ("evil.example:x", ""),
        ("[::1]x", ""),
    ],
)
def test_a_host_header_is_named_without_its_port(header, name) -> None:
    """The name of a Host header, without port or IPv6 brackets ("" when malformed)."""
    assert host_name(header) == name


def test_the_allow_list_and_loopback() -> None:
    """Exact names, any port; "*" allows any; only loopback addresses are loopback."""
    assert host_allowed("localhost:1234", ("127.0.0.1", "localhost", "::1"))
    assert not host_allowed("localhost.evil.example", ("localhost",))
    assert not host_allowed(None, ("localhost",))
    assert host_allowed("anything:1", ("*",))
    assert host_allowed("kirim.internal", ("kirim.internal:8000",))
    assert all(loopback(h) for h in ("127.0.0.2", "::1", "[::1]", "localhost"))
    assert not any(loopback(h) for h in ("0.0.0.0", "kirim.internal"))
