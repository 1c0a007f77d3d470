"""The worker's named points where a test may pause it (``kirim.testing.Checkpoints``)
or the explorer may stall its host: the ``Checkpoint`` protocol they implement."""

from __future__ import annotations

from typing import Any, Protocol

#: where the worker calls its checkpoint, in the order of one delivery's protocol
CHECKPOINTS = ("after_claim", "before_provider_request", "after_provider_response", "before_commit")


class Checkpoint(Protocol):
    """Called by the worker at each of ``CHECKPOINTS``; it may wait, or raise."""

    async def hit(self, name: str, *, worker_id: str, delivery_id: int, **context: Any) -> None:
        """Reached ``name`` for ``delivery_id``; the delivery goes on when this returns."""
