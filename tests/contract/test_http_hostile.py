"""Hostile requests on both backends: one bad request fails alone, the logs keep no
payload, and a replay or a repeated header is answered exactly."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from http_kit import BODY, Api, api_on
from kirim.errors import StoreError
from kirim.observe.logging import configure

MARKER = "PAYLOAD-d41d8cd98f00"


@pytest.fixture
async def api(make_app):
    async with api_on(await make_app()) as found:
        yield found


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    """kirim's log lines (JSON), written while the test runs (ask for it before ``api``:
    an app binds its loggers when it is made)."""
    out = io.StringIO()
    configure(fmt="json", level="info", stream=out)
    yield out
    configure(level="warning")


async def post_raw(api: Api, body: Any, key: str) -> httpx.Response:
    """POST a body as json.dumps writes it: a lone surrogate travels as a \\u escape."""
    return await api.client.post(
        "/v1/notifications",
        content=json.dumps(body),
        headers={"Content-Type": "application/json", "Idempotency-Key": key},
    )


# -- one bad request fails alone (item 1) -----------------------------------------------


async def test_a_hostile_payload_fails_alone_among_concurrent_valid_requests(api: Api) -> None:
    """Lone surrogates and NUL in payloads sent among 40 concurrent valid requests: only
    they are refused (422, naming the payload), every valid one is 201, and their keys
    are not left in progress (the same request again is 422, not 409)."""
    hostile = [
        {**BODY, "event_id": "bad-1", "payload": {"t": "\ud800"}},
        {**BODY, "event_id": "bad-2", "payload": {"k\udfff": 1}},
        {**BODY, "event_id": "bad-3", "payload": ["ok", {"deep": ["a\x00b"]}]},
    ]
    valid = [{**BODY, "event_id": f"ok-{i}", "payload": {"n": i}} for i in range(40)]
    bodies = valid[:20] + hostile + valid[20:]
    answers = await asyncio.gather(*(post_raw(api, b, f"k-{b['event_id']}") for b in bodies))
    by_event = {b["event_id"]: a for b, a in zip(bodies, answers, strict=True)}
    for body in valid:
        assert by_event[body["event_id"]].status_code == 201, body
    for body in hostile:
        refused = by_event[body["event_id"]]
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error["code"] == "validation_error"
        assert "payload" in error["message"]
        assert {d["field"] for d in error["details"]} <= {"body.payload"}
        again = await post_raw(api, body, f"k-{body['event_id']}")
        assert again.status_code == 422
    assert (await api.kirim.store.counts())["deliveries"] == {"pending": 40}


async def test_a_row_the_store_refuses_fails_only_its_own_request(api: Api, monkeypatch) -> None:
    """A batch that the store refuses because of one request's row is written again
    request by request: that request gets 503, the 30 sharing its commits get 201."""
    store = api.kirim.store
    real = store.handle_requests

    async def refusing(begin, enqueue, **kw):
        if any(it.delivery.event_id == "poison" for it in enqueue):
            raise StoreError("the row of event poison is refused")
        return await real(begin, enqueue, **kw)

    monkeypatch.setattr(store, "handle_requests", refusing)
    bodies = [{**BODY, "event_id": f"ok-{i}"} for i in range(30)]
    bodies.insert(15, {**BODY, "event_id": "poison"})
    answers = await asyncio.gather(*(api.post(b, key=f"k-{b['event_id']}") for b in bodies))
    codes = {b["event_id"]: a.status_code for b, a in zip(bodies, answers, strict=True)}
    assert codes.pop("poison") == 503
    assert set(codes.values()) == {201}
    assert (await store.counts())["deliveries"] == {"pending": 30}


# -- no payload in the logs (item 14) ---------------------------------------------------


async def test_a_500_is_logged_without_the_payload(log_lines, api: Api, monkeypatch) -> None:
    """An unexpected exception whose message carries the response body (as a
    UnicodeEncodeError does) answers 500 in the error format and logs its type and
    place, never its message."""

    async def failing(begin, enqueue, **kw):
        body = json.dumps({"payload": {"secret": MARKER}})
        raise UnicodeEncodeError("utf-8", body, 0, 1, "surrogates not allowed")

    monkeypatch.setattr(api.kirim.store, "handle_requests", failing)
    response = await api.post({**BODY, "payload": {"secret": MARKER}}, key="k-1")
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal_error"
    assert MARKER not in response.text
    text = log_lines.getvalue()
    assert MARKER not in text
    (line,) = [json.loads(x) for x in text.splitlines() if '"internal_error"' in x]
    assert line["error"] == "UnicodeEncodeError"
    assert line["path"] == "/v1/notifications"
    assert "test_http_hostile.py" in line["at"]


async def test_a_store_error_is_logged_without_the_data(log_lines, api: Api, monkeypatch) -> None:
    """A database error is logged by its first line (PostgreSQL's by class and
    SQLSTATE): never its DETAIL or CONTEXT, which quote the rows."""

    async def failing(begin, enqueue, **kw):
        raise StoreError(
            f"PostgreSQL: invalid input syntax for type json\nCONTEXT: JSON data: {MARKER}"
        )

    monkeypatch.setattr(api.kirim.store, "handle_requests", failing)
    response = await api.post({**BODY, "payload": {"secret": MARKER}}, key="k-1")
    assert response.status_code == 503
    text = log_lines.getvalue()
    assert MARKER not in text
    assert "invalid input syntax for type json" in text


# -- replays and repeated headers (item 15) ---------------------------------------------


async def test_a_replay_keeps_the_location(api: Api) -> None:
    """The replay of a 201 answers the same Location as the first response."""
    first = await api.post(key="k-1")
    again = await api.post(key="k-1")
    assert again.headers["idempotent-replayed"] == "true"
    assert again.headers["location"] == first.headers["location"]
    assert first.headers["location"] == f"/v1/notifications/{first.json()['id']}"


async def test_two_idempotency_key_headers_are_400(api: Api) -> None:
    """Two Idempotency-Key headers are refused, not reduced to the first; nothing is
    written."""
    response = await api.client.post(
        "/v1/notifications",
        json=BODY,
        headers=[("Idempotency-Key", "k-1"), ("Idempotency-Key", "k-2")],
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "bad_request"
    assert [d["field"] for d in error["details"]] == ["header.idempotency-key"]
    assert (await api.kirim.store.counts())["deliveries"] == {}


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/notifications"),
        ("POST", "/v1/events"),
        ("PUT", "/v1/recipients/u1/preferences"),
    ],
)
async def test_a_client_that_disconnects_mid_body_is_no_500(
    log_lines, api: Api, method: str, path: str
) -> None:
    """A client gone before its body ended is logged and counted as 499 (client closed
    request), never as an internal error: it was logged, counted and metered as a 500
    (error=ClientDisconnect), which pages someone for nothing."""
    sent: list[dict[str, Any]] = []
    body = [
        {"type": "http.request", "body": b'{"event_id": "x", "recip', "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> dict[str, Any]:
        return body.pop(0) if body else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"testserver"),
            (b"authorization", f"Bearer {api.token}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", b"1000"),
        ],
        "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
        "state": {},
    }
    await api.app(scope, receive, send)
    lines = [json.loads(line) for line in log_lines.getvalue().splitlines()]
    assert not [line for line in lines if line.get("level") == "error"], lines
    access = [line for line in lines if line["event"] == "http_request"]
    assert [line["status"] for line in access] == [499]
    metrics = await api.client.get("/metrics")
    assert 'status="500"' not in metrics.text
    assert 'status="499"' in metrics.text
