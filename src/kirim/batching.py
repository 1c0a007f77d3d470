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
    once, so batching adds no latency.
    """

    def __init__(
        self, write: Callable[[Sequence[I]], Awaitable[list[R]]], *, max_batch: int = 512
    ) -> None:
        self._write = write
        self._max = max_batch
        self._pending: list[tuple[I, asyncio.Future[R]]] = []
        self._drainer: asyncio.Task[None] | None = None

    async def submit(self, item: I) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._pending:
            batch, self._pending = self._pending[: self._max], self._pending[self._max :]
            try:
                results = await self._write([item for item, _ in batch])
            except Exception as exc:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            except BaseException:
                for _, future in batch:
                    future.cancel()
                raise
            for (_, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)
