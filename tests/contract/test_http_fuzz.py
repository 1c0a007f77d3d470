"""Hostile requests to every API route, among valid ones, on a real server (both backends).

Hypothesis writes the hostile request: arbitrary JSON bodies, strings with lone
surrogates and NUL (sent as JSON escapes, or as raw bytes in a URL), huge numbers,
malformed headers. Each is sent to the service on 127.0.0.1 (uvicorn in a thread)
together with valid notifications, all at once, so that they share the intake's
commits. No answer may be a 500, and every valid request must be recorded (201).
Bounded: the same 300 examples each run, under ten seconds per backend.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from http_kit import BODY, served
from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim
from kirim.http import create_app
from kirim.testing import FlakyProvider
from kirim.tokens import create_token

EXAMPLES = 300
VALID_PER_EXAMPLE = 4


@dataclass(frozen=True)
class Hostile:
    method: str
    path: str
    content: bytes | None = None
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


# -- the hostile values ------------------------------------------------------------------

_surrogate = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
_char = st.one_of(st.characters(codec="utf-8"), st.just("\x00"), _surrogate)
text = st.text(_char, max_size=12)
huge = st.one_of(
    st.integers(),
    st.integers(min_value=2**63 - 2, max_value=2**64),
    st.integers(min_value=10**30, max_value=10**600),
    st.integers(max_value=-(10**30)),
)
scalars = st.one_of(
    st.none(), st.booleans(), huge, st.floats(allow_nan=False, allow_infinity=False), text
)
#: text with at least one NUL or lone surrogate
poison = st.tuples(text, st.one_of(_surrogate, st.just("\x00")), text).map("".join)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)
#: numbers no Python value prints: past a float, past Python's digits limit, tiny
raw_numbers = st.sampled_from(
    ["1e999", "-1e999", "1e-999", "9" * 5000, "0." + "0" * 400 + "1", "-0", "1E+308"]
)
FIELDS = ["event_id", "recipient", "channel", "payload", "key", "send_after"]
#: hostile bodies, those that pass the body's schema (payloads) the most often
BODY_KINDS = ["field", "extra", "anything", "raw_number"] + ["payload", "poisoned"] * 3
#: the routes, POST /v1/notifications (the intake, "create") the most often
ROUTES = ["create"] * 7 + ["list", "one", "timeline", "cancel", "dead", "retry", "ops"]


def _url_text(value: str) -> str:
    """``value`` for a URL: percent-encoded UTF-8, a lone surrogate as its raw bytes."""
    return quote(value.encode("utf-8", "surrogatepass"), safe="")


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """A POST /v1/notifications body: a valid one with a hostile field, or anything."""
    kind = draw(st.sampled_from(BODY_KINDS))
    body: Any = dict(BODY, event_id=f"hostile-{draw(st.integers(0, 10**6))}")
    if kind == "field":
        body[draw(st.sampled_from(FIELDS))] = draw(st.one_of(text, json_values))
    elif kind == "payload":
        body["payload"] = draw(json_values)
    elif kind == "poisoned":  # valid but for one string, or one key, deep in the payload
        bad = draw(poison)
        body["payload"] = draw(
            st.sampled_from([bad, [1, bad], {"a": {"b": bad}}, {bad: 1}, [{"k": [bad]}]])
        )
    elif kind == "extra":
        body[draw(text)] = draw(json_values)
    elif kind == "anything":
        body = draw(json_values)
    else:
        head = json.dumps({k: v for k, v in BODY.items() if k != "payload"})
        return f'{head[:-1]}, "payload": {draw(raw_numbers)}}}'.encode()
    return json.dumps(body).encode()  # ensure_ascii: a lone surrogate is a \u escape


_header_value = st.binary(max_size=300).map(
    lambda b: bytes(c for c in b if 0x20 <= c <= 0x7E or c >= 0x80).strip()
)


@st.composite
def hostile_requests(draw: st.DrawFn) -> Hostile:
    """One hostile request to one of the API's routes."""
    route = draw(st.sampled_from(ROUTES))
    if route == "create":
        headers = [(b"content-type", b"application/json")]
        mode = draw(st.sampled_from(["none", "none", "fresh", "fresh", "hostile"]))
        if mode == "fresh":
            headers.append((b"idempotency-key", f"h-{draw(st.integers(0, 10**9))}".encode()))
        elif mode == "hostile":  # refused before the body's fields are looked at
            keys = draw(st.lists(_header_value, min_size=1, max_size=2))
            headers += [(b"idempotency-key", k) for k in keys]
        return Hostile("POST", "/v1/notifications", draw(bodies()), headers)
    ident = draw(st.one_of(huge.map(str), text.map(_url_text), st.sampled_from(["1", "0", "-1"])))
    ident = ident or "0"
    query_value = st.one_of(huge.map(str), text, raw_numbers).map(
        lambda v: _url_text(v) if isinstance(v, str) else str(v)
    )
    names = st.sampled_from(["status", "channel", "cursor", "limit", "q", "x\x00"])
    params = draw(st.lists(st.tuples(names, query_value), max_size=3))
    query = "&".join(f"{_url_text(k)}={v}" for k, v in params)
    path = {
        "list": ("GET", "/v1/notifications"),
        "one": ("GET", f"/v1/notifications/{ident}"),
        "timeline": ("GET", f"/v1/notifications/{ident}/timeline"),
        "cancel": ("POST", f"/v1/notifications/{ident}/cancel"),
        "dead": ("GET", "/v1/dead-letters"),
        "retry": ("POST", f"/v1/dead-letters/{ident}/retry"),
        "ops": ("GET", draw(st.sampled_from(["/healthz", "/readyz", "/metrics"]))),
    }[route]
    return Hostile(path[0], path[1] + (f"?{query}" if query else ""))


# -- the server ---------------------------------------------------------------------------


def _kirim(database_url: str) -> Kirim:
    push = Channel(name="push", provider=FlakyProvider())
    return Kirim(Config(database=database_url), channels={"push": push})


def _prepare(database_url: str) -> str:
    """Migrate, record a notification (ids 1 exists); return a token."""

    async def go() -> str:
        kirim = _kirim(database_url)
        await kirim.open(migrate=True)
        try:
            await kirim.notify("e0", "u", "push", {"n": 0})
            _, secret = await create_token(kirim.store, "fuzz", now=kirim.clock.now())
            return secret
        finally:
            await kirim.close()

    return asyncio.run(go())


@pytest.fixture
def runner() -> Iterator[asyncio.Runner]:
    with asyncio.Runner() as found:
        yield found


def test_hostile_requests_never_fail_the_valid_ones(
    database_url: str, runner: asyncio.Runner
) -> None:
    """No answer to a hostile request is a 5xx, and the valid requests sent with it
    (sharing its commits) are all recorded."""
    token = _prepare(database_url)
    numbers = itertools.count(1)
    with served(create_app(_kirim(database_url), token_cache=1.0)) as base:
        client = httpx.AsyncClient(
            base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=10
        )

        async def valid(n: int) -> httpx.Response:
            body = {**BODY, "event_id": f"valid-{n}", "payload": {"n": n}}
            return await client.post(
                "/v1/notifications", json=body, headers={"Idempotency-Key": f"valid-{n}"}
            )

        async def together(hostile: Hostile) -> tuple[httpx.Response, list[httpx.Response]]:
            request = client.build_request(
                hostile.method, hostile.path, content=hostile.content, headers=hostile.headers
            )
            answers = await asyncio.gather(
                client.send(request), *(valid(next(numbers)) for _ in range(VALID_PER_EXAMPLE))
            )
            return answers[0], list(answers[1:])

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(hostile=hostile_requests())
        def run(hostile: Hostile) -> None:
            answer, valid_answers = runner.run(together(hostile))
            assert answer.status_code < 500, (hostile, answer.status_code, answer.text)
            assert answer.headers["content-type"].startswith(("application/json", "text/plain"))
            for v in valid_answers:
                assert v.status_code == 201, (hostile, v.status_code, v.text)

        try:
            run()
            # what was recorded reads back: every page of the list answers 200
            cursor: str | None = None
            seen = 0
            while True:
                params = {"limit": "200"} | ({"cursor": cursor} if cursor else {})
                page = runner.run(client.get("/v1/notifications", params=params))
                assert page.status_code == 200
                seen += len(page.json()["items"])
                cursor = page.json()["next_cursor"]
                if cursor is None:
                    break
            assert seen >= 1 + EXAMPLES * VALID_PER_EXAMPLE
        finally:
            runner.run(client.aclose())
