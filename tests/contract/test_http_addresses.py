"""``/v1/recipients/{id}/addresses`` on both backends: add, list, refuse, forget."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from http_kit import Api, api_on
from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim
from kirim.testing import ManualClock
from kirim.views import iso

TOKEN = "ab" * 32


class _Apns:
    """A provider that takes APNs device tokens (the address kind is what matters here)."""

    idempotent = True
    address_kind = "apns"

    async def send(self, message: object) -> None:  # pragma: no cover - never sent here
        raise AssertionError("no delivery in these tests")


@pytest.fixture
async def api(database_url: str, clock: ManualClock) -> AsyncIterator[Api]:
    channels = {"ios": Channel(name="ios", provider=_Apns())}  # type: ignore[arg-type]
    app = Kirim(Config(database=database_url), channels=channels, clock=clock)
    await app.open(migrate=True)
    try:
        async with api_on(app) as found:
            yield found
    finally:
        await app.close()


def url(recipient_id: str = "u-1") -> str:
    return f"/v1/recipients/{recipient_id}/addresses"


async def test_post_then_get_lists_the_address_as_stored(api: Api, clock: ManualClock) -> None:
    """POST answers 201 with the address; GET lists it; the engine reads what the API wrote."""
    made = await api.client.post(url(), json={"channel": "ios", "address": TOKEN, "label": "iPad"})
    assert made.status_code == 201, made.text
    assert made.json() == {
        "recipient_id": "u-1",
        "channel": "ios",
        "address": TOKEN,
        "label": "iPad",
        "added_at": iso(clock.now()),
        "retired": False,
        "retired_at": None,
        "retired_reason": None,
    }
    listed = await api.client.get(url())
    assert listed.status_code == 200
    assert listed.json() == {"recipient_id": "u-1", "addresses": [made.json()]}
    assert [a.address for a in await api.kirim.addresses("u-1")] == [TOKEN]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"channel": "ios", "address": "not a token"}, "body.address"),
        ({"channel": "sms", "address": TOKEN}, "body.channel"),
        ({"channel": "ios", "address": 7}, "body.address"),
        ({"channel": "ios", "address": TOKEN, "extra": 1}, "body"),
    ],
)
async def test_a_bad_address_is_422_naming_the_field(api: Api, body: dict, field: str) -> None:
    """An address the channel cannot take, an unknown channel, a value that is not text
    or an unknown key: 422 naming the field, nothing stored."""
    answer = await api.client.post(url(), json=body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["details"][0]["field"] == field
    assert await api.kirim.addresses("u-1") == []


async def test_delete_forgets_it_then_answers_404(api: Api) -> None:
    """DELETE with the channel and address answers 204 once, then 404."""
    await api.client.post(url(), json={"channel": "ios", "address": TOKEN})
    params = {"channel": "ios", "address": TOKEN}
    assert (await api.client.delete(url(), params=params)).status_code == 204
    assert (await api.client.delete(url(), params=params)).status_code == 404
    assert (await api.client.get(url())).json()["addresses"] == []
