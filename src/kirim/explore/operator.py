"""The operator's actions, behind one adapter.

Today ``store.cancel`` and ``store.retry_dead`` answer True (done) or False
(refused). Once an earlier attempt can be unsettled, they may refuse with
``kirim.errors.NotSettled`` (its ``retry_at`` says when to try again) or queue the
action: ``act`` turns all of these into one ``Answer``, and ``perform`` tries
again at ``retry_at`` a bounded number of times.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import kirim.errors

ACTIONS = ("cancel", "retry")


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    done: bool
    #: store time at which to try again (the action waits for earlier attempts)
    retry_at: float | None = None
    reason: str = ""


async def act(store: Any, action: str, delivery_id: int, *, now: float) -> Answer:
    """One operator action through the store's own API."""
    not_settled: Any = getattr(kirim.errors, "NotSettled", None)
    method = {"cancel": "cancel", "retry": "retry_dead"}[action]
    try:
        result = await getattr(store, method)(delivery_id, now=now)
    except kirim.errors.StoreError as exc:
        return Answer(done=False, reason=f"store error: {exc}")
    except Exception as exc:
        if not_settled is not None and isinstance(exc, not_settled):
            return Answer(done=False, retry_at=getattr(exc, "retry_at", None), reason="not settled")
        raise
    if result is False:
        return Answer(done=False, reason="refused")
    return Answer(done=True, reason="" if result is True else f"queued: {result!r}")


async def perform(
    store: Any,
    action: str,
    delivery_id: int,
    *,
    now: Callable[[], float],
    tries: int = 5,
) -> Answer:
    """``act``, waiting for ``retry_at`` (up to ``tries`` times) when not settled."""
    answer = Answer(done=False)
    for _ in range(tries):
        answer = await act(store, action, delivery_id, now=now())
        if answer.done or answer.retry_at is None:
            return answer
        await asyncio.sleep(min(120.0, max(0.1, answer.retry_at - now())))
    return answer
