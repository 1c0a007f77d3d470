"""The HTTP API on both backends: Idempotency-Key semantics, routes, auth, errors."""

from __future__ import annotations

import asyncio
import json

import pytest

from http_kit import BODY, Api, api_on
from kirim.config import ServeSettings
from kirim.http.idempotency import HOLD, fingerprint
from kirim.keys import default_key
from kirim.model import DeliveryStatus, JobStatus
from kirim.store.base import RequestBegin, RequestState
from kirim.testing import FlakyProvider
from kirim.views import delivery_json
from kirim.worker import WorkerSettings


@pytest.fixture
async def api(make_app):
    async with api_on(await make_app()) as found:
        yield found


async def in_progress_elsewhere(make_app, key: str, body: dict) -> None:
    """Another server (its own store connection) took the key and has not answered."""
    other = await make_app()
    begin = RequestBegin(idempotency_key=key, fingerprint=fingerprint(body), lock_token="t-other")
    slots, _ = await other.store.handle_requests(
        [begin], [], now=other.clock.now(), hold=HOLD, respond=lambda _: None
    )
    assert slots[0].state is RequestState.ACQUIRED


# -- POST /v1/notifications ------------------------------------------------------------


async def test_a_new_notification_answers_201_with_the_delivery(api: Api) -> None:
    """201, a Location, and the delivery's JSON as `kirim status --json` prints it."""
    response = await api.post(key="k-1")
    assert response.status_code == 201
    data = response.json()
    assert response.headers["location"] == f"/v1/notifications/{data['id']}"
    assert "idempotent-replayed" not in response.headers
    assert data["idempotency_key"] == "k-1"
    assert data["status"] == "pending"
    assert data["job"]["status"] == "queued"
    assert data["attempts"] == []
    record = await api.kirim.get(data["id"])
    assert data == delivery_json(record)


async def test_a_replay_answers_the_original_response(api: Api, clock) -> None:
    """Same key and body again: same status and body, marked replayed, one delivery."""
    first = await api.post(key="k-1")
    clock.advance(5)
    again = await api.post(key="k-1")
    assert again.status_code == first.status_code == 201
    assert again.content == first.content
    assert again.headers["idempotent-replayed"] == "true"
    assert (await api.kirim.store.counts())["deliveries"] == {"pending": 1}


async def test_the_fingerprint_ignores_key_order_and_spacing(api: Api) -> None:
    """The canonical body is compared, not its bytes."""
    await api.post(key="k-1")
    reordered = json.dumps(dict(reversed(list(BODY.items()))), indent=3)
    again = await api.client.post(
        "/v1/notifications",
        content=reordered,
        headers={"Idempotency-Key": "k-1", "Content-Type": "application/json"},
    )
    assert again.status_code == 201
    assert again.headers["idempotent-replayed"] == "true"


async def test_the_same_key_with_another_body_is_refused(api: Api) -> None:
    """422 idempotency_key_reused, and nothing is written."""
    await api.post(key="k-1")
    response = await api.post({**BODY, "payload": {"n": 2}}, key="k-1")
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "idempotency_key_reused"
    other_event = await api.post({**BODY, "event_id": "order-2"}, key="k-1")
    assert other_event.status_code == 422
    assert (await api.kirim.store.counts())["deliveries"] == {"pending": 1}


async def test_a_key_in_progress_on_another_server_gets_409(api: Api, make_app, clock) -> None:
    """The in-progress state is a database row: another server's request is seen."""
    await in_progress_elsewhere(make_app, "k-1", BODY)
    busy = await api.post(key="k-1")
    assert busy.status_code == 409
    assert busy.json()["error"]["code"] == "request_in_progress"
    assert busy.headers["retry-after"] == "1"
    other_body = await api.post({**BODY, "payload": {"n": 2}}, key="k-1")
    assert other_body.status_code == 422
    assert (await api.kirim.store.counts())["deliveries"] == {}


async def test_an_abandoned_key_is_taken_over_after_its_hold(api: Api, make_app, clock) -> None:
    """A server that died mid-request holds the key only until its hold expires."""
    await in_progress_elsewhere(make_app, "k-1", BODY)
    clock.advance(HOLD + 1)
    response = await api.post(key="k-1")
    assert response.status_code == 201
    assert (await api.post(key="k-1")).headers["idempotent-replayed"] == "true"


async def test_concurrent_identical_requests_make_one_delivery(api: Api) -> None:
    """Twenty at once: one delivery; every answer is 201 (the same body) or 409."""
    answers = await asyncio.gather(*(api.post(key="k-1") for _ in range(20)))
    codes = sorted({a.status_code for a in answers})
    assert set(codes) <= {201, 409}
    created = [a for a in answers if a.status_code == 201]
    assert created
    assert len({a.content for a in created}) == 1
    assert (await api.kirim.store.counts())["deliveries"] == {"pending": 1}


async def test_two_servers_on_one_database_make_one_delivery(api: Api, make_app) -> None:
    """Requests with one key spread over two servers (two stores): one delivery, and
    every answer is the first response (201) or in progress (409)."""
    async with api_on(await make_app(), name="second") as other:
        answers = await asyncio.gather(
            *(server.post(key="k-1") for _ in range(10) for server in (api, other))
        )
        assert {a.status_code for a in answers} <= {201, 409}
        assert len({a.content for a in answers if a.status_code == 201}) == 1
        again = await other.post(key="k-1")
        assert again.status_code == 201
        assert again.headers["idempotent-replayed"] == "true"
    assert (await api.kirim.store.counts())["deliveries"] == {"pending": 1}


async def test_without_a_header_the_body_key_or_the_default_key_is_used(api: Api) -> None:
    """The body's key, else sha256 of event, recipient and channel; replays either way."""
    plain = await api.post()
    assert plain.json()["idempotency_key"] == default_key("order-1", "user-1", "push")
    assert (await api.post()).headers["idempotent-replayed"] == "true"
    keyed = await api.post({**BODY, "event_id": "order-2", "key": "body-key"})
    assert keyed.json()["idempotency_key"] == "body-key"
    both = await api.post({**BODY, "key": "body-key-2"}, key="body-key-2")
    assert both.status_code == 201
    differ = await api.post({**BODY, "key": "a"}, key="b")
    assert differ.status_code == 422
    assert differ.json()["error"]["details"][0]["field"] == "body.key"


async def test_a_structured_field_header_is_unquoted(api: Api) -> None:
    """`Idempotency-Key: "abc"` (the draft's sf-string) names the key abc."""
    response = await api.post(key='"abc\\"d"')
    assert response.json()["idempotency_key"] == 'abc"d'


async def test_a_delivery_recorded_outside_the_api(api: Api) -> None:
    """A key that notify() used: 200 with that delivery (same payload), else 422."""
    n = await api.kirim.notify("order-1", "user-1", "push", {"n": 1}, key="k-1")
    same = await api.post(key="k-1")
    assert same.status_code == 200
    assert same.json()["id"] == n.delivery_id
    other = await api.post({**BODY, "payload": {"n": 9}}, key="k-1")
    assert other.status_code == 422
    assert other.json()["error"]["code"] == "idempotency_key_reused"


async def test_send_after_schedules_the_job(api: Api, clock) -> None:
    """send_after (ISO-8601 with a timezone) is the job's run_at."""
    response = await api.post({**BODY, "send_after": "2030-01-01T09:00:00+07:00"})
    assert response.status_code == 201
    assert response.json()["job"]["run_at"] == "2030-01-01T02:00:00.000Z"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**BODY, "event_id": 7}, "body.event_id"),
        ({**BODY, "event_id": ""}, "body.event_id"),
        ({**BODY, "recipient": "   "}, "body.recipient"),
        ({**BODY, "recipient": "a\x00b"}, "body.recipient"),
        ({**BODY, "channel": None}, "body.channel"),
        ({**BODY, "extra": 1}, "body.extra"),
        ({**BODY, "send_after": "tomorrow"}, "body.send_after"),
        ({**BODY, "send_after": "2030-01-01T09:00:00"}, "body.send_after"),
        ({**BODY, "send_after": "9999-12-31T23:00:00-05:00"}, "body.send_after"),
        ({**BODY, "key": ""}, "body.key"),
        ({k: v for k, v in BODY.items() if k != "payload"}, "body.payload"),
        ([1, 2], "body"),
    ],
)
async def test_invalid_bodies_are_422_with_the_field(api: Api, body, field) -> None:
    """Strict validation: the error names the field, nothing is written."""
    response = await api.post(body)
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "validation_error"
    assert [d["field"] for d in error["details"]] == [field]
    assert (await api.kirim.store.counts())["deliveries"] == {}


async def test_bad_input_gets_clear_4xx(api: Api) -> None:
    """Unknown channel 422, not JSON 400, NaN 400, wrong media type 415, bad header 400."""
    unknown = await api.post({**BODY, "channel": "fax"})
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (422, "unknown_channel")
    content = {"Content-Type": "application/json"}
    broken = await api.client.post("/v1/notifications", content=b"{nope", headers=content)
    assert (broken.status_code, broken.json()["error"]["code"]) == (400, "malformed_json")
    nan = await api.client.post("/v1/notifications", content=b'{"payload": NaN}', headers=content)
    assert nan.status_code == 400
    deep = await api.client.post(
        "/v1/notifications", content=b"[" * 100_000 + b"]" * 100_000, headers=content
    )
    assert deep.status_code == 400
    text = await api.client.post("/v1/notifications", content=json.dumps(BODY))
    assert (text.status_code, text.json()["error"]["code"]) == (415, "unsupported_media_type")
    long_key = await api.post(key="k" * 300)
    assert long_key.status_code == 400
    assert long_key.json()["error"]["details"][0]["field"] == "header.idempotency-key"


async def test_bodies_over_the_limit_are_413(make_app) -> None:
    """The request body limit, and the configured payload limit."""
    kirim = await make_app()
    async with api_on(kirim, settings=ServeSettings(max_body_bytes=2048)) as api:
        big = await api.post({**BODY, "payload": "x" * 4096})
        assert (big.status_code, big.json()["error"]["code"]) == (413, "body_too_large")

        async def chunks():
            for _ in range(10):
                yield b"x" * 1000

        streamed = await api.client.post(
            "/v1/notifications", content=chunks(), headers={"Content-Type": "application/json"}
        )
        assert streamed.status_code == 413
    kirim.config = kirim.config.__class__(database=kirim.config.database, max_payload_bytes=64)
    async with api_on(kirim, name="tests-2") as api:
        payload = await api.post({**BODY, "payload": "y" * 100})
        assert (payload.status_code, payload.json()["error"]["code"]) == (
            413,
            "payload_too_large",
        )


# -- reading and operating -------------------------------------------------------------


async def test_get_one_notification_agrees_with_the_cli(api: Api) -> None:
    """GET /v1/notifications/{id} is `kirim status --json`; missing is 404."""
    created = (await api.post(key="k-1")).json()
    got = await api.client.get(f"/v1/notifications/{created['id']}")
    assert got.status_code == 200
    assert got.json() == delivery_json(await api.kirim.get(created["id"]))
    missing = await api.client.get("/v1/notifications/999")
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")
    assert (await api.client.get("/v1/notifications/abc")).status_code == 422


async def test_an_id_is_never_confused_with_a_key(api: Api) -> None:
    """A delivery whose key is another one's id does not answer for that id."""
    await api.post(key="2")
    second = (await api.post({**BODY, "event_id": "other"}, key="other")).json()
    got = await api.client.get(f"/v1/notifications/{second['id']}")
    assert got.json()["idempotency_key"] == "other"


async def test_list_pages_with_a_cursor_and_filters(api: Api) -> None:
    """Oldest first; next_cursor until the last page; status and channel filters."""
    ids = [(await api.post({**BODY, "event_id": f"e{i}"})).json()["id"] for i in range(5)]
    seen, cursor, pages = [], None, 0
    while True:
        params = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = (await api.client.get("/v1/notifications", params=params)).json()
        seen += [item["id"] for item in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids
    assert pages == 3
    await api.client.post(f"/v1/notifications/{ids[0]}/cancel")
    canceled = await api.client.get("/v1/notifications", params={"status": "canceled"})
    assert [i["id"] for i in canceled.json()["items"]] == [ids[0]]
    other = await api.client.get("/v1/notifications", params={"channel": "sms"})
    assert other.json() == {"items": [], "next_cursor": None}
    bad = await api.client.get("/v1/notifications", params={"status": "lost"})
    assert bad.status_code == 422
    assert (await api.client.get("/v1/notifications", params={"cursor": "x"})).status_code == 422
    huge = await api.client.get("/v1/notifications", params={"cursor": "9" * 19})
    assert huge.status_code == 422


async def test_cancel(api: Api) -> None:
    """A pending notification is canceled; again is 409; a missing one 404."""
    created = (await api.post()).json()
    done = await api.client.post(f"/v1/notifications/{created['id']}/cancel")
    assert done.status_code == 200
    assert done.json()["status"] == "canceled"
    again = await api.client.post(f"/v1/notifications/{created['id']}/cancel")
    assert (again.status_code, again.json()["error"]["code"]) == (409, "not_cancelable")
    assert (await api.client.post("/v1/notifications/77/cancel")).status_code == 404


async def test_dead_letters_list_and_retry(make_app, clock) -> None:
    """A permanently failed delivery is listed; retry requeues it once."""
    kirim = await make_app(FlakyProvider(script=["permanent"]))
    async with api_on(kirim) as api:
        created = (await api.post()).json()
        await kirim.worker(settings=WorkerSettings(lease=10), worker_id="A").run_once()
        listed = (await api.client.get("/v1/dead-letters")).json()["items"]
        assert [d["id"] for d in listed] == [created["id"]]
        assert listed[0]["job"]["status"] == "dead"
        assert listed[0]["attempts"][0]["status"] == "failed_permanent"
        retried = await api.client.post(f"/v1/dead-letters/{created['id']}/retry")
        assert retried.status_code == 200
        assert retried.json()["status"] == DeliveryStatus.PENDING
        assert retried.json()["job"]["status"] == JobStatus.QUEUED
        again = await api.client.post(f"/v1/dead-letters/{created['id']}/retry")
        assert (again.status_code, again.json()["error"]["code"]) == (409, "not_dead_lettered")
        assert (await api.client.get("/v1/dead-letters")).json() == {"items": []}
        assert (await api.client.post("/v1/dead-letters/55/retry")).status_code == 404


async def test_the_timeline_of_a_notification(make_app, clock) -> None:
    """Requests and answers as log lines, oldest first."""
    kirim = await make_app(FlakyProvider())
    async with api_on(kirim) as api:
        created = (await api.post()).json()
        clock.advance(1)
        await kirim.worker(settings=WorkerSettings(lease=10), worker_id="A").run_once()
        got = (await api.client.get(f"/v1/notifications/{created['id']}/timeline")).json()
        actions = [e["action"] for e in got["events"]]
        assert actions[0] == "enqueued"
        assert "provider_request" in actions
        assert "provider_response" in actions
        request = next(e for e in got["events"] if e["action"] == "provider_request")
        assert " worker=A job_id=" in request["line"]
        assert " attempt=1 action=provider_request request_id=req-" in request["line"]


# -- auth, health, metrics, errors ---------------------------------------------------------


async def test_every_v1_route_needs_a_token(api: Api) -> None:
    """401 with WWW-Authenticate, without a token or with a wrong one."""
    routes = [
        ("POST", "/v1/notifications"),
        ("GET", "/v1/notifications"),
        ("GET", "/v1/notifications/1"),
        ("GET", "/v1/notifications/1/timeline"),
        ("POST", "/v1/notifications/1/cancel"),
        ("GET", "/v1/dead-letters"),
        ("POST", "/v1/dead-letters/1/retry"),
    ]
    for method, path in routes:
        anonymous = await api.client.request(method, path, headers={"Authorization": ""})
        assert anonymous.status_code == 401, path
        assert anonymous.headers["www-authenticate"] == 'Bearer realm="kirim"'
        assert anonymous.json()["error"]["code"] == "unauthorized"
        wrong = await api.client.request(
            method, path, headers={"Authorization": "Bearer kirim_wrong"}
        )
        assert wrong.status_code == 401, path
        assert 'error="invalid_token"' in wrong.headers["www-authenticate"]


async def test_a_revoked_token_stops_working(api: Api) -> None:
    """Revocation is checked against the store (no cache in this test)."""
    assert (await api.client.get("/v1/notifications")).status_code == 200
    assert await api.kirim.store.revoke_token("tests", now=api.kirim.clock.now())
    assert (await api.client.get("/v1/notifications")).status_code == 401


async def test_health_readiness_and_metrics(api: Api) -> None:
    """Open by default; /metrics has kirim's series and the HTTP ones."""
    anonymous = {"Authorization": ""}
    assert (await api.client.get("/healthz", headers=anonymous)).json() == {"status": "ok"}
    assert (await api.client.get("/readyz", headers=anonymous)).json() == {"status": "ready"}
    await api.post()
    await api.post()
    metrics = await api.client.get("/metrics", headers=anonymous)
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    text = metrics.text
    assert 'kirim_deliveries{status="pending"} 1.0' in text
    assert 'kirim_enqueue_conflicts_total{channel="push"}' not in text  # a replay is no conflict
    assert (
        'kirim_http_requests_total{method="POST",route="/v1/notifications",status="201"} 2.0'
        in text
    )


async def test_readyz_says_when_the_database_is_gone(api: Api) -> None:
    """503 in the error format."""
    await api.kirim.store.close()
    response = await api.client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "unavailable"


async def test_metrics_can_be_protected(make_app) -> None:
    """--protect-metrics: 401 without a token, 200 with one."""
    async with api_on(await make_app(), settings=ServeSettings(protect_metrics=True)) as api:
        assert (await api.client.get("/metrics", headers={"Authorization": ""})).status_code == 401
        assert (await api.client.get("/metrics")).status_code == 200


async def test_unknown_routes_and_methods_use_the_error_format(api: Api) -> None:
    """404 and 405 are errors like the others."""
    missing = await api.client.get("/v2/nothing")
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")
    wrong = await api.client.delete("/v1/notifications")
    assert (wrong.status_code, wrong.json()["error"]["code"]) == (405, "method_not_allowed")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"event_id": "order-2"}, "event_id"),
        ({"recipient": "user-2", "payload": {"n": 2}}, "recipient"),
        ({"payload": {"n": 2}}, "payload"),
    ],
)
async def test_a_reused_key_names_the_field_that_differs(api: Api, change, field) -> None:
    """422 idempotency_key_reused names the body's field that differs from the key's
    delivery (event and recipient before payload), and nothing is written."""
    await api.post(key="k-1")
    response = await api.post({**BODY, **change}, key="k-1")
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "idempotency_key_reused"
    assert f"different {field};" in error["message"]
    assert [d["field"] for d in error["details"]] == [f"body.{field}"]
    assert (await api.kirim.store.counts())["deliveries"] == {"pending": 1}


async def test_a_key_notify_used_for_another_recipient_is_refused(api: Api) -> None:
    """A key that notify() used for another recipient (same payload) is 422, naming it."""
    await api.kirim.notify("order-1", "user-9", "push", {"n": 1}, key="k-1")
    response = await api.post(key="k-1")
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "idempotency_key_reused"
    assert [d["field"] for d in error["details"]] == ["body.recipient"]
    assert (await api.kirim.store.counts())["deliveries"] == {"pending": 1}


async def test_a_replay_answers_its_response_after_the_channel_is_gone(api: Api, make_app) -> None:
    """A completed request replays its first response even once its channel is removed
    from the configuration (it got 422 unknown_channel), with or without a header."""
    first = await api.post(key="k-1")
    without = await api.post({**BODY, "event_id": "order-2"})
    assert first.status_code == without.status_code == 201
    later = await make_app(channel="sms")  # the same database, without channel push
    async with api_on(later, name="later") as other:
        again = await other.post(key="k-1")
        assert again.status_code == 201, again.text
        assert again.headers["Idempotent-Replayed"] == "true"
        assert again.json() == first.json()
        assert again.headers["location"] == first.headers["location"]
        replayed = await other.post({**BODY, "event_id": "order-2"})
        assert replayed.status_code == 201, replayed.text
        assert replayed.json() == without.json()
        fresh = await other.post({**BODY, "event_id": "order-3"})
        assert fresh.status_code == 422
        assert fresh.json()["error"]["code"] == "unknown_channel"
        # the refused request took nothing: its key is free for a valid body
        ok = await other.post({**BODY, "event_id": "order-3", "channel": "sms"})
        assert ok.status_code == 201, ok.text


async def test_a_number_json_cannot_keep_is_a_422_naming_the_payload(api: Api) -> None:
    """A payload of 1e999 (a float's infinity once read) is refused naming body.payload,
    before its key is taken: the key then records a valid body (it was a 500 while the
    key was looked up first)."""
    raw = b'{"event_id": "e", "recipient": "r", "channel": "push", "payload": 1e999}'
    headers = {"Content-Type": "application/json", "Idempotency-Key": "k-inf"}
    answer = await api.client.post("/v1/notifications", content=raw, headers=headers)
    assert answer.status_code == 422, answer.text
    assert [d["field"] for d in answer.json()["error"]["details"]] == ["body.payload"]
    ok = await api.post(key="k-inf")
    assert ok.status_code == 201, ok.text
