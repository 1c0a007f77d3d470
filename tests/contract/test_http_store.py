"""The store methods of the HTTP service, on both backends: tokens, requests, search."""

from __future__ import annotations

import pytest

from kirim.keys import canonical_json, payload_hash
from kirim.model import EnqueueResult
from kirim.store.base import (
    NewDelivery,
    RequestBegin,
    RequestedDelivery,
    RequestState,
    StoredResponse,
)
from kirim.tokens import create_token, hash_token

HOLD = 10.0


def new_delivery(key: str, payload: object = None) -> NewDelivery:
    text = canonical_json({"k": key} if payload is None else payload)
    return NewDelivery(
        idempotency_key=key,
        event_id=f"event-{key}",
        recipient="u",
        channel="push",
        payload_json=text,
        payload_hash=payload_hash(text),
        run_at=0.0,
        max_attempts=3,
    )


def keep(result: EnqueueResult) -> StoredResponse | None:
    return StoredResponse(status_code=201, body=f"delivery {result.delivery.id}")


async def begin(store, now, *pairs: tuple[str, str, str]):
    items = [RequestBegin(idempotency_key=k, fingerprint=f, lock_token=t) for k, f, t in pairs]
    slots, _ = await store.handle_requests(items, [], now=now, hold=HOLD, respond=keep)
    return slots


async def enqueue(store, now, *pairs: tuple[str, str], respond=keep):
    items = [RequestedDelivery(delivery=new_delivery(k), lock_token=t) for k, t in pairs]
    _, done = await store.handle_requests([], items, now=now, hold=HOLD, respond=respond)
    return done


# -- tokens --------------------------------------------------------------------------------


async def test_tokens_are_stored_hashed_and_verified(make_app, clock) -> None:
    """Only the hash is kept; the secret verifies; a wrong one does not."""
    app = await make_app()
    token, secret = await create_token(app.store, "billing", now=clock.now())
    assert token.name == "billing"
    assert secret.startswith("kirim_")
    assert token.prefix == secret[:10]
    assert len(secret) > 40
    assert await app.store.verify_token(hash_token(secret)) == token
    assert await app.store.verify_token(hash_token(secret + "x")) is None
    assert await app.store.verify_token(secret) is None  # the clear token is not a hash


async def test_names_are_unique_among_active_tokens(make_app, clock) -> None:
    """A second active token with one name is refused; after revocation it is allowed."""
    app = await make_app()
    first = await app.store.create_token("ci", hash_token("a"), prefix="kirim_aaaa", now=1.0)
    assert first is not None
    assert await app.store.create_token("ci", hash_token("b"), prefix="kirim_bbbb", now=2.0) is None
    revoked = await app.store.revoke_token("ci", now=3.0)
    assert revoked is not None
    assert revoked.revoked_at == 3.0
    assert await app.store.verify_token(hash_token("a")) is None
    second = await app.store.create_token("ci", hash_token("b"), prefix="kirim_bbbb", now=4.0)
    assert second is not None
    assert [t.id for t in await app.store.list_tokens()] == [second.id]
    assert [t.id for t in await app.store.list_tokens(include_revoked=True)] == [
        first.id,
        second.id,
    ]


async def test_revoke_by_id_and_missing(make_app) -> None:
    """NAME_OR_ID: a name first, else an id; nothing active: None."""
    app = await make_app()
    made = await app.store.create_token("ci", hash_token("a"), prefix="kirim_aaaa", now=1.0)
    assert made is not None
    assert await app.store.revoke_token("nobody", now=2.0) is None
    assert await app.store.revoke_token("999999999999999999999", now=2.0) is None
    assert await app.store.revoke_token("a\x00b", now=2.0) is None
    got = await app.store.revoke_token(str(made.id), now=2.0)
    assert got is not None
    assert got.name == "ci"
    assert await app.store.revoke_token(str(made.id), now=3.0) is None


# -- idempotent requests ---------------------------------------------------------------------


async def test_a_key_is_taken_once_then_completed(make_app, clock) -> None:
    """begin takes the key; a second begin sees it in progress; enqueue completes it."""
    app = await make_app()
    now = clock.now()
    first, second = await begin(app.store, now, ("k", "fp", "t1"), ("k", "fp2", "t2"))
    assert first.state is RequestState.ACQUIRED
    assert second.state is RequestState.IN_PROGRESS
    assert second.fingerprint == "fp"
    [(result, kept)] = await enqueue(app.store, now, ("k", "t1"))
    assert result.created
    assert kept == StoredResponse(status_code=201, body=f"delivery {result.delivery.id}")
    [slot] = await begin(app.store, now + 1, ("k", "fp3", "t3"))
    assert slot.state is RequestState.COMPLETED
    assert slot.fingerprint == "fp"
    assert (slot.status_code, slot.response) == (201, kept.body)


async def test_an_expired_hold_is_taken_over_and_the_old_holder_is_fenced(make_app, clock) -> None:
    """After the hold, another request takes the key; the first can no longer complete it."""
    app = await make_app()
    now = clock.now()
    await begin(app.store, now, ("k", "fp", "t1"))
    [early] = await begin(app.store, now + HOLD - 1, ("k", "fp", "t2"))
    assert early.state is RequestState.IN_PROGRESS
    [late] = await begin(app.store, now + HOLD + 1, ("k", "fp-new", "t2"))
    assert late.state is RequestState.ACQUIRED
    [(stale, _)] = await enqueue(app.store, now + HOLD + 2, ("k", "t1"))
    assert stale.created  # the delivery is written: its key is what keeps it single
    [slot] = await begin(app.store, now + HOLD + 3, ("k", "fp-new", "t3"))
    assert slot.state is RequestState.IN_PROGRESS  # t1's completion was fenced out
    [(again, kept)] = await enqueue(app.store, now + HOLD + 4, ("k", "t2"))
    assert not again.created
    assert kept is not None
    [done] = await begin(app.store, now + HOLD + 5, ("k", "fp-new", "t4"))
    assert done.state is RequestState.COMPLETED


async def test_respond_none_releases_the_key(make_app, clock) -> None:
    """An answer that is not kept gives the key back at once."""
    app = await make_app()
    now = clock.now()
    await begin(app.store, now, ("k", "fp", "t1"))
    [(_, kept)] = await enqueue(app.store, now, ("k", "t1"), respond=lambda _: None)
    assert kept is None
    [slot] = await begin(app.store, now, ("k", "fp2", "t2"))
    assert slot.state is RequestState.ACQUIRED


async def test_one_step_completes_some_and_begins_others(make_app, clock) -> None:
    """A key completed and begun in the same step is seen completed."""
    app = await make_app()
    now = clock.now()
    await begin(app.store, now, ("a", "fa", "ta"))
    items = [RequestedDelivery(delivery=new_delivery("a"), lock_token="ta")]
    begins = [
        RequestBegin(idempotency_key="a", fingerprint="fa", lock_token="tx"),
        RequestBegin(idempotency_key="b", fingerprint="fb", lock_token="tb"),
    ]
    slots, done = await app.store.handle_requests(begins, items, now=now, hold=HOLD, respond=keep)
    assert [s.state for s in slots] == [RequestState.COMPLETED, RequestState.ACQUIRED]
    assert done[0][0].created
    assert await app.store.handle_requests([], [], now=now, hold=HOLD, respond=keep) == ([], [])


async def test_search_by_id_key_or_event(make_app) -> None:
    """The dashboard's search: newest first; nothing for text that matches nothing."""
    app = await make_app()
    a = await app.notify("order-7", "u1", "push", {}, key="key-a")
    b = await app.notify("order-7", "u2", "push", {}, key="key-b")
    found = await app.store.search_deliveries("order-7")
    assert [d.id for d in found] == [b.delivery_id, a.delivery_id]
    assert [d.id for d in await app.store.search_deliveries("key-a")] == [a.delivery_id]
    assert [d.id for d in await app.store.search_deliveries(str(b.delivery_id))] == [b.delivery_id]
    assert await app.store.search_deliveries("nothing") == []
    assert await app.store.search_deliveries("a\x00b") == []
    assert await app.store.search_deliveries("9" * 30) == []


@pytest.mark.parametrize("limit", [1, 2])
async def test_search_is_limited(make_app, limit) -> None:
    app = await make_app()
    for i in range(3):
        await app.notify("same", f"u{i}", "push", {})
    assert len(await app.store.search_deliveries("same", limit=limit)) == limit


async def test_a_double_takeover_keeps_the_creators_answer(make_app, clock) -> None:
    """The first request (t1) stalls past its hold; a retry of the same body takes the
    key over (t2) and stalls too; t1 wakes and creates the delivery; then t2 finds it
    made and gives the key back. The creator's kept answer survives t2's release, so a
    replay gets the 201 (issue 20, defect 11: on main t1's completion was fenced out and
    t2's release deleted the row: a replay got 200)."""
    app = await make_app()
    now = clock.now()
    await begin(app.store, now, ("k", "fp", "t1"))
    [taken] = await begin(app.store, now + HOLD + 1, ("k", "fp", "t2"))
    assert taken.state is RequestState.ACQUIRED

    def http(result: EnqueueResult) -> StoredResponse | None:  # the API keeps new ones only
        return keep(result) if result.created else None

    def requested(token: str) -> RequestedDelivery:
        return RequestedDelivery(delivery=new_delivery("k"), lock_token=token, fingerprint="fp")

    [(made, kept)] = (
        await app.store.handle_requests(
            [], [requested("t1")], now=now + HOLD + 2, hold=HOLD, respond=http
        )
    )[1]
    assert made.created
    assert kept is not None
    [(found, none)] = (
        await app.store.handle_requests(
            [], [requested("t2")], now=now + HOLD + 3, hold=HOLD, respond=http
        )
    )[1]
    assert not found.created
    assert none is None  # t2 releases what it holds: nothing, now
    [replay] = await begin(app.store, now + HOLD + 4, ("k", "fp", "t3"))
    assert replay.state is RequestState.COMPLETED
    assert (replay.status_code, replay.response) == (201, f"delivery {made.delivery.id}")
