"""The dashboard's pages and forms, without a browser (see tests/acceptance for one)."""

from __future__ import annotations

import re

import pytest

from http_kit import BODY, Api, api_on
from kirim.config import ServeSettings
from kirim.testing import FlakyProvider
from kirim.worker import WorkerSettings

ANON = {"Authorization": ""}
SAME_ORIGIN = {"Origin": "http://testserver", **ANON}
#: the test client's Host (http://testserver) is allowed, as a name of this host would be
LOCAL = ServeSettings(allowed_hosts=("testserver",))


@pytest.fixture
async def api(make_app):
    kirim = await make_app(FlakyProvider(script=["permanent"]))
    async with api_on(kirim, settings=LOCAL) as found:
        yield found


async def dead_letter(api: Api, **body) -> int:
    """A notification whose job is dead (the provider refused it)."""
    created = (await api.post({**BODY, **body})).json()
    await api.kirim.worker(settings=WorkerSettings(lease=10), worker_id="A").run_once()
    return int(created["id"])


async def test_the_overview_shows_counts_queue_and_dead_letters(api: Api) -> None:
    dead = await dead_letter(api, event_id="order-dead")
    await api.post({**BODY, "event_id": "order-2"})
    page = await api.client.get("/", headers=ANON)
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    html = page.text
    assert re.search(r'id="count-total">2<', html)
    assert re.search(r'id="count-failed">1<', html)
    assert re.search(r'id="count-pending">1<', html)
    assert re.search(r'id="queue-depth">1<', html)
    assert re.search(r'id="dead-total">1<', html)
    assert f'action="/dashboard/notifications/{dead}/retry"' in html
    assert f'action="/dashboard/notifications/{dead}/cancel"' in html
    css = await api.client.get("/static/dashboard.css", headers=ANON)
    assert css.headers["content-type"].startswith("text/css")


async def test_search_by_key_event_or_id(api: Api) -> None:
    created = (await api.post(key="order-77-push")).json()
    for q in ("order-77-push", "order-1", str(created["id"])):
        page = await api.client.get("/", params={"q": q}, headers=ANON)
        assert f'href="/dashboard/notifications/{created["id"]}"' in page.text, q
    nothing = await api.client.get("/", params={"q": "nope"}, headers=ANON)
    assert "no notification has this key" in nothing.text


async def test_the_notification_page_draws_its_timeline(api: Api) -> None:
    dead = await dead_letter(api)
    page = await api.client.get(f"/dashboard/notifications/{dead}", headers=ANON)
    assert page.status_code == 200
    assert "action=provider_request request_id=req-" in page.text
    assert "worker=A" in page.text
    missing = await api.client.get("/dashboard/notifications/999", headers=ANON)
    assert missing.status_code == 404


async def test_retry_and_cancel_buttons_redirect_back_with_a_message(api: Api) -> None:
    dead = await dead_letter(api)
    form = {"back": "/?q=order-1"}
    done = await api.client.post(
        f"/dashboard/notifications/{dead}/retry", data=form, headers=SAME_ORIGIN
    )
    assert done.status_code == 303
    assert done.headers["location"] == f"/?q=order-1&msg=retried&id={dead}"
    page = await api.client.get(done.headers["location"], headers=ANON)
    assert f"notification {dead} requeued" in page.text
    again = await api.client.post(
        f"/dashboard/notifications/{dead}/retry", data={"back": "/"}, headers=SAME_ORIGIN
    )
    assert again.headers["location"] == f"/?msg=not_retried&id={dead}"
    canceled = await api.client.post(
        f"/dashboard/notifications/{dead}/cancel",
        data={"back": "https://evil.example/"},
        headers=SAME_ORIGIN,
    )
    assert canceled.headers["location"] == f"/?msg=canceled&id={dead}"
    status = (await api.client.get(f"/v1/notifications/{dead}")).json()["status"]
    assert status == "canceled"


async def test_a_form_posted_from_another_site_is_refused(api: Api) -> None:
    dead = await dead_letter(api)
    for headers in (
        {"Origin": "http://evil.example", **ANON},
        {"Sec-Fetch-Site": "cross-site", **ANON},
    ):
        refused = await api.client.post(f"/dashboard/notifications/{dead}/retry", headers=headers)
        assert refused.status_code == 403
    job = (await api.client.get(f"/v1/notifications/{dead}")).json()["job"]
    assert job["status"] == "dead"


async def test_user_data_is_escaped(api: Api) -> None:
    created = (await api.post({**BODY, "event_id": "<script>alert(1)</script>"})).json()
    page = await api.client.get(f"/dashboard/notifications/{created['id']}", headers=ANON)
    assert "<script>alert(1)</script>" not in page.text
    assert "&lt;script&gt;" in page.text
    flash = await api.client.get("/", params={"msg": "<b>x</b>", "id": "<i>"}, headers=ANON)
    assert "<b>x</b>" not in flash.text


async def test_a_protected_dashboard_needs_a_login(make_app) -> None:
    """Redirect to the login form; a good token sets an HttpOnly SameSite cookie."""
    settings = ServeSettings(protect_dashboard=True)
    async with api_on(await make_app(), settings=settings) as api:
        page = await api.client.get("/?q=x", headers=ANON)
        assert page.status_code == 303
        assert page.headers["location"] == "/dashboard/login?next=/%3Fq%3Dx"
        assert (await api.client.get("/", headers=ANON | {"Cookie": ""})).status_code == 303
        with_header = await api.client.get("/")
        assert with_header.status_code == 200
        form = await api.client.get("/dashboard/login?next=/", headers=ANON)
        assert 'name="token"' in form.text
        wrong = await api.client.post(
            "/dashboard/login", data={"token": "nope", "next": "/"}, headers=SAME_ORIGIN
        )
        assert wrong.status_code == 401
        good = await api.client.post(
            "/dashboard/login", data={"token": api.token, "next": "/?q=x"}, headers=SAME_ORIGIN
        )
        assert good.status_code == 303
        assert good.headers["location"] == "/?q=x"
        cookie = good.headers["set-cookie"]
        assert "HttpOnly" in cookie
        assert "SameSite=strict" in cookie
        logged_in = await api.client.get("/", headers=ANON)  # the client keeps the cookie
        assert logged_in.status_code == 200
        assert "log out (tests)" in logged_in.text
        out = await api.client.post("/dashboard/logout", headers=SAME_ORIGIN)
        assert out.status_code == 303
        assert (await api.client.get("/", headers=ANON)).status_code == 303
