"""Group commit: many coroutines submit one item each, one transaction writes them all."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

I = TypeVar("I")  # noqa: E741
R = TypeVar("R")


class Batcher(Generic[I, R]):
    """Collects items submitted while the previous batch was being written.

    Under load every commit carries many items; when idle an item is written at
    once, so batching adds no latency. A batch that fails is written again item by
    item, so that one bad row fails only its own submitter.
    """

    def __init__(
        self, write: Callable[[Sequence[I]], Awaitable[list[R]]], *, max_batch: int = 512
    ) -> None:
        self._write = write
        self._max = max_batch
        self._pending: list[tuple[I, asyncio.Future[R]]] = []
        self._drainer: asyncio.Task[None] | None = None

    def submit(self, item: I) -> asyncio.Future[R]:
        """The future of ``item``'s result, which its submitter awaits (a plain call, not
        a coroutine: no coroutine made and resumed per item)."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        return future

    async def _drain(self) -> None:
        while self._pending:
            batch, self._pending = self._pending[: self._max], self._pending[self._max :]
            try:
                results = await self._write([item for item, _ in batch])
            except Exception as exc:
                if len(batch) == 1:
                    _, future = batch[0]
                    if not future.done():
                        future.set_exception(exc)
                    continue
                # One bad row must not fail the others: write them one by one.
                await self._one_by_one(batch)
                continue
            except BaseException:
                for _, future in batch:
                    future.cancel()
                raise
            for (_, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)

    async def _one_by_one(self, batch: list[tuple[I, asyncio.Future[R]]]) -> None:
        """Write each item of a failed batch alone; each gets its own result or error."""
        for item, future in batch:
            try:
                (result,) = await self._write([item])
            except Exception as exc:
                if not future.done():
                    future.set_exception(exc)
                continue
            except BaseException:
                for _, rest in batch:
                    rest.cancel()
                raise
            if not future.done():
                future.set_result(result)
