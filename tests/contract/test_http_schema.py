"""The OpenAPI document: kept in the repository, and honoured (schemathesis, both backends).

Schemathesis generates requests from the served document, valid and invalid ones,
and sends them over loopback to the service run by uvicorn in a thread: no answer
may be a 500, and every answer must be documented (status, media type, schema).
Bounded: a few examples per run, no deadline, the same examples each run.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from http_kit import served
from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim
from kirim.http import create_app
from kirim.http.openapi import document, render, stored
from kirim.notify import parse_type
from kirim.testing import FlakyProvider
from kirim.tokens import create_token

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]
EXAMPLES = 120


def test_the_served_document_is_the_one_in_the_repository() -> None:
    """A change to the API is a change to src/kirim/http/openapi.json
    (regenerate it with `python -m kirim.http.openapi`)."""
    assert render(document()) == render(stored())


#: a notification type of the server, whose one variable schemathesis may leave out
SHIPPED = parse_type("order_shipped", {"templates": {"push": {"title": "{{ order_id }}"}}})


def _kirim(database_url: str) -> Kirim:
    push = Channel(name="push", provider=FlakyProvider())
    return Kirim(Config(database=database_url), channels={"push": push}, types=[SHIPPED])


def _prepare(database_url: str) -> str:
    """Migrate the database, record a few notifications; return a token."""

    async def go() -> str:
        kirim = _kirim(database_url)
        await kirim.open(migrate=True)
        try:
            for i in range(3):
                await kirim.notify(f"e{i}", "u", "push", {"n": i})
            _, secret = await create_token(kirim.store, "schemathesis", now=kirim.clock.now())
            return secret
        finally:
            await kirim.close()

    return asyncio.run(go())


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_schemathesis_finds_no_server_error_and_no_violation(
    database_url: str, mode: GenerationMode
) -> None:
    token = _prepare(database_url)
    app = create_app(_kirim(database_url), token_cache=0)
    with served(app) as base:
        doc = httpx.get(f"{base}/openapi.json").json()
        assert doc == json.loads(render(stored()))
        # this server's channels, so that valid bodies are also accepted ones
        body = doc["components"]["schemas"]["NewNotification"]["properties"]
        body["channel"]["enum"] = ["push"]
        event = doc["components"]["schemas"]["NewEvent"]["properties"]
        event["type"]["enum"] = ["order_shipped"]
        # a stream never ends, so a request-and-response fuzzer waits out its timeout on
        # each; its own tests are tests/contract/test_feed_stream.py
        schema = schemathesis.openapi.from_dict(doc).exclude(operation_id="feed_stream")
        headers = {"Authorization": f"Bearer {token}"}
        strategy = schema.as_strategy(mode, headers=headers)

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=strategy)
        def run(case: schemathesis.Case) -> None:
            response = case.call(base_url=base, timeout=10)
            case.validate_response(response, checks=CHECKS, headers=headers)

        run()
