"""A provider that accepts everything at once: for benchmarks of kirim itself."""

from __future__ import annotations

from typing import Any

from kirim.providers.base import Message, Sent


class NullProvider:
    """Accepts everything at once: for benchmarks of kirim itself."""

    def __init__(self, *, idempotent: bool = True, **_: Any) -> None:
        self.idempotent = idempotent
        self.count = 0

    async def send(self, message: Message) -> Sent:
        self.count += 1
        return Sent(provider_message_id=f"p-{message.delivery_id}")

    async def aclose(self) -> None:
        return None
