"""The dashboard's pages and forms, without a browser (see tests/acceptance for one)."""

from __future__ import annotations

import re

import pytest

from http_kit import BODY, Api, api_on
from kirim.config import ServeSettings
from kirim.model import OnUnknown
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


# -- needs a human, browse, the activity chart (issue 13, item 5) ----------------------


async def troubles(api: Api, make_app) -> dict[str, int]:
    """One of each kind that needs a human, made by real workers: a dead letter (refused
    for good), one held in doubt (its answer lost, channel ``hold``), one sent under
    assume_sent (channel ``assume``); and one sent for certain, which needs nobody."""
    lost = ["accept_then_timeout"]
    hold = await make_app(
        FlakyProvider(idempotent=False, script=lost), channel="hold", on_unknown=OnUnknown.HOLD
    )
    assume = await make_app(FlakyProvider(idempotent=False, script=lost), channel="assume")
    fine = await make_app(FlakyProvider(), channel="fine")
    ids = {"dead": await dead_letter(api, event_id="order-dead")}
    for name, app in (("held", hold), ("assumed", assume), ("fine", fine)):
        channel = next(iter(app.channel_names))
        created = await app.notify(f"order-{name}", "user-1", channel, {})
        await app.worker(settings=WorkerSettings(lease=10), worker_id=name).run_once()
        ids[name] = created.delivery_id
    return ids


def section(html: str, ident: str) -> str:
    """The HTML of one <section> of a page, found by its heading's id."""
    match = re.search(rf'<section aria-labelledby="{ident}-h">(.*?)</section>', html, re.S)
    assert match, ident
    return match.group(1)


def buttons(html: str, delivery_id: int) -> set[str]:
    return set(re.findall(rf'action="/dashboard/notifications/{delivery_id}/(\w+)"', html))


async def test_the_attention_page_lists_each_kind_with_its_timeline(api: Api, make_app) -> None:
    """Dead letters, held and assumed-sent deliveries, once each, each with its timeline
    and a link to its page, with the buttons its state allows; a sent one is absent."""
    ids = await troubles(api, make_app)
    page = await api.client.get("/dashboard/attention", headers=ANON)
    assert page.status_code == 200
    html = page.text
    dead = section(html, "attention-dead")
    held = section(html, "attention-held")
    assumed = section(html, "attention-assumed")
    for text, name in ((dead, "dead"), (held, "held"), (assumed, "assumed")):
        delivery_id = ids[name]
        assert f'<tbody class="record" id="attention-{name}-{delivery_id}">' in text, name
        assert f'href="/dashboard/notifications/{delivery_id}"' in text
        assert "<details>" in text
        assert "action=provider_request request_id=req-" in text
        others = {ids[k] for k in ("dead", "held", "assumed", "fine")} - {delivery_id}
        assert not any(f'data-id="{other}"' in text for other in others), name
    assert "result=failed_permanent" in dead
    assert "status=in_doubt doubt=held" in held
    assert "result=unknown" in assumed
    assert buttons(dead, ids["dead"]) == {"retry", "cancel"}
    assert buttons(held, ids["held"]) == {"retry", "cancel", "reconcile"}
    assert buttons(assumed, ids["assumed"]) == {"reconcile"}  # sent: only its doubt to settle
    assert f'data-id="{ids["fine"]}"' not in html
    assert re.search(r'id="attention-assumed-count">1<', html)
    overview = await api.client.get("/", headers=ANON)
    assert 'href="/dashboard/attention"' in overview.text


async def test_the_attention_page_says_when_nothing_needs_a_human(api: Api) -> None:
    """No trouble: each section says it is empty."""
    page = await api.client.get("/dashboard/attention", headers=ANON)
    assert page.status_code == 200
    for empty in ("no dead letters", "nothing held in doubt", "nothing assumed sent"):
        assert empty in page.text


def ids_in(html: str) -> list[int]:
    """The ids of the browse page's rows, in order."""
    table = re.search(r'<table id="browse-results">(.*?)</table>', html, re.S)
    return [] if table is None else [int(x) for x in re.findall(r'data-id="(\d+)"', table[1])]


async def test_browse_filters_by_status_channel_doubt_and_dead(api: Api, make_app) -> None:
    """Each filter narrows the rows; newest first unless asked for the oldest first."""
    ids = await troubles(api, make_app)
    pending = (await api.post({**BODY, "event_id": "order-pending"})).json()["id"]

    async def shown(**params: str) -> list[int]:
        page = await api.client.get("/dashboard/browse", params=params, headers=ANON)
        assert page.status_code == 200, page.text
        return ids_in(page.text)

    everything = sorted([*ids.values(), pending], reverse=True)
    assert await shown() == everything
    assert await shown(order="oldest") == everything[::-1]
    assert await shown(status="pending") == [pending]
    assert await shown(status="sent") == [ids["fine"], ids["assumed"]]
    assert await shown(status="sent", doubt="assumed_sent") == [ids["assumed"]]
    assert await shown(doubt="held") == [ids["held"]]
    assert await shown(channel="hold") == [ids["held"]]
    assert await shown(dead="1") == sorted([ids["held"], ids["dead"]], reverse=True)
    assert await shown(channel="nowhere") == []
    page = await api.client.get("/dashboard/browse", params={"status": "failed"}, headers=ANON)
    assert '<option value="failed" selected>' in page.text


async def test_browse_filters_by_creation_time_in_utc(api: Api, clock) -> None:
    """from is inclusive, until exclusive; datetime-local values and ISO text with an
    offset both read as UTC."""
    made = []
    for minute in range(3):  # 08:00, 08:01, 08:02 UTC
        clock.set(1_800_000_000.0 + 60 * minute)
        made.append((await api.post({**BODY, "event_id": f"order-t{minute}"})).json()["id"])

    async def shown(**params: str) -> list[int]:
        page = await api.client.get("/dashboard/browse", params=params, headers=ANON)
        assert page.status_code == 200, page.text
        return ids_in(page.text)

    assert await shown(**{"from": "2027-01-15T08:01"}) == [made[2], made[1]]
    assert await shown(until="2027-01-15T08:01") == [made[0]]
    both = {"from": "2027-01-15T09:00:30+01:00", "until": "2027-01-15T08:02:00Z"}
    assert await shown(**both) == [made[1]]
    page = await api.client.get("/dashboard/browse", params=both, headers=ANON)
    assert 'name="from" value="2027-01-15T08:00:30"' in page.text  # shown back in UTC


async def test_browse_pages_with_newer_and_older_links(api: Api) -> None:
    """Five deliveries two by two: older links walk down, newer links walk back up to
    the first page, and the links keep the filters."""
    made = [(await api.post({**BODY, "event_id": f"order-p{i}"})).json()["id"] for i in range(5)]
    newest = sorted(made, reverse=True)
    url = "/dashboard/browse?channel=push&limit=2"
    seen, pages = [], []
    while True:
        html = (await api.client.get(url, headers=ANON)).text
        seen.append(ids_in(html))
        pages.append(html)
        onward = re.search(r'<a href="([^"]+)" id="page-next"', html)
        if onward is None:
            break
        url = onward[1].replace("&amp;", "&")
        assert "channel=push" in url
        assert "limit=2" in url
    assert seen == [newest[0:2], newest[2:4], newest[4:5]]
    assert 'id="page-back"' not in pages[0]
    back = []
    html = pages[-1]
    while (previous := re.search(r'<a href="([^"]+)" id="page-back"', html)) is not None:
        html = (await api.client.get(previous[1].replace("&amp;", "&"), headers=ANON)).text
        back.append(ids_in(html))
    assert back == [newest[2:4], newest[0:2]]
    oldest = await api.client.get(url.replace("limit=2", "limit=2&order=oldest"), headers=ANON)
    assert oldest.status_code == 200


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"status": "lost"}, "status must be one of pending, processing"),
        ({"doubt": "maybe"}, "doubt must be one of assumed_sent, held, resolved"),
        ({"dead": "perhaps"}, "dead must be 1"),
        ({"from": "yesterday"}, "from must be a date and time in UTC"),
        ({"until": "2027-02-30T10:00"}, "until must be a date and time in UTC"),
        ({"from": "0001-01-01T00:00"}, "from must be between 1970 and 9999"),
        ({"from": "2027-01-02T00:00", "until": "2027-01-01"}, "from must be before until"),
        ({"order": "random"}, "order must be newest or oldest"),
        ({"cursor": "-1"}, "cursor must be a whole number"),
        ({"cursor": "9" * 19}, "cursor must be a whole number"),
        ({"cursor": "1" * 5000}, "cursor must be text of at most 200 characters"),
        ({"limit": "0"}, "limit must be a whole number from 1 to 200"),
        ({"limit": "1e3"}, "limit must be a whole number from 1 to 200"),
        ({"channel": "a\x00b"}, "channel must be text"),
        ({"channel": "tab\there"}, "channel must be printable text"),
        ([("status", "sent"), ("status", "failed")], "status is given 2 times"),
    ],
)
async def test_browse_answers_bad_input_with_the_page_and_a_message(
    api: Api, params, message: str
) -> None:
    """Every query parameter is checked: a bad one gets the page with a message naming
    it and 422, never a 500 and never a query."""
    page = await api.client.get("/dashboard/browse", params=params, headers=ANON)
    assert page.status_code == 422, page.text
    assert page.headers["content-type"].startswith("text/html")
    assert 'role="alert"' in page.text
    assert message in page.text
    assert '<table id="browse-results">' not in page.text


async def test_browse_never_echoes_markup(api: Api) -> None:
    """What was typed is shown back in the form as text."""
    page = await api.client.get(
        "/dashboard/browse", params={"channel": '"><script>x</script>'}, headers=ANON
    )
    assert page.status_code == 200
    assert "<script>x</script>" not in page.text
    assert "&lt;script&gt;" in page.text


async def test_the_overview_draws_the_activity_chart_with_its_numbers(
    api: Api, make_app, clock
) -> None:
    """Sent, failed and in doubt of the last 3 hours, per minute: an inline SVG whose
    <desc> and table say the same numbers."""
    await troubles(api, make_app)  # all at 08:00 UTC: one failed, two in doubt, one sent
    clock.advance(30)
    page = await api.client.get("/", headers=ANON)
    assert page.status_code == 200
    html = page.text
    desc = (
        "From 05:00 to 08:01 UTC, per minute: 1 sent, 1 failed, 2 in doubt. "
        "The busiest minute, 08:00 UTC, had 4."
    )
    assert re.search(r'<svg [^>]*id="activity-chart"[^>]*role="img"', html)
    assert f'<desc id="activity-chart-desc">{desc}</desc>' in html
    assert f'<figcaption id="activity-summary">{desc}</figcaption>' in html
    assert re.search(r'id="activity-sent">1<', html)
    assert re.search(r'id="activity-failed">1<', html)
    assert re.search(r'id="activity-in-doubt">2<', html)
    assert (
        '<tr><td class="time">2027-01-15T08:00:00.000Z</td><td>1</td><td>1</td><td>2</td></tr>'
        in html
    )
    clock.advance(3 * 3600 + 60)  # 11:01:30: the window starts at 08:01, after them
    later = (await api.client.get("/", headers=ANON)).text
    assert "nothing sent, failed or in doubt in this window" in later
    assert "0 sent, 0 failed, 0 in doubt. Nothing happened." in later


async def test_the_chart_window_is_1_to_24_hours(api: Api) -> None:
    """hours=24 draws 5-minute buckets; anything but a whole number 1 to 24 gets the
    overview, a message and 422."""
    day = await api.client.get("/", params={"hours": "24"}, headers=ANON)
    assert day.status_code == 200
    assert "Deliveries per 5 minutes, last 24 h (UTC)" in day.text
    for bad in ("0", "25", "3.5", "abc", "-1", "٣"):
        page = await api.client.get("/", params={"hours": bad}, headers=ANON)
        assert page.status_code == 422, bad
        assert "hours must be a whole number from 1 to 24" in page.text
        assert "last 3 h" in page.text
    long = await api.client.get("/", params={"hours": "1" * 100}, headers=ANON)
    assert long.status_code == 422


@pytest.mark.parametrize(
    "query",
    [
        "order=oldest&cursor=9223372036854775807",
        "cursor=9223372036854775807",
        "cursor=0",
        "order=oldest&cursor=0",
        "order=oldest&cursor=1&limit=1",
        "status=&channel=&doubt=&dead=&from=&until=&order=&limit=&cursor=",
        "dead=on&order=oldest&unknown=1&msg=%3Cb%3E&id=x",
        "channel=%F0%9F%93%A6&from=2027-01-15",
    ],
)
async def test_browse_takes_edge_values_without_an_error(api: Api, query: str) -> None:
    """Cursors at both ends of the ids (either order), empty fields, unknown
    parameters, non-ASCII text and a bare date: the page, 200."""
    await api.post(BODY)
    page = await api.client.get(f"/dashboard/browse?{query}", headers=ANON)
    assert page.status_code == 200, page.text


async def test_a_held_doubt_offers_reconcile_and_the_button_settles_it(make_app, clock) -> None:
    """A delivery held in doubt on a channel whose provider can be asked shows a
    Reconcile button; pressing it asks the provider and settles the doubt (found: sent)."""
    provider = FlakyProvider(idempotent=False, script=["accept_then_timeout"])
    kirim = await make_app(provider, on_unknown=OnUnknown.HOLD, lookup=True, max_attempts=1)
    async with api_on(kirim, settings=LOCAL) as api:
        created = (await api.post(BODY)).json()
        held = int(created["id"])
        await kirim.worker(settings=WorkerSettings(lease=10), worker_id="A").run_once()
        assert (await api.client.get(f"/v1/notifications/{held}")).json()["status"] == "in_doubt"
        clock.advance(3600)
        page = await api.client.get(f"/dashboard/notifications/{held}", headers=ANON)
        assert f'action="/dashboard/notifications/{held}/reconcile"' in page.text
        done = await api.client.post(
            f"/dashboard/notifications/{held}/reconcile", data={"back": "/"}, headers=SAME_ORIGIN
        )
        assert done.headers["location"] == f"/?msg=reconciled&id={held}"
        shown = (await api.client.get(f"/v1/notifications/{held}")).json()
        assert (shown["status"], shown["doubt"]) == ("sent", "resolved")
        assert len(provider.requests) == 1
