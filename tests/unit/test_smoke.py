"""A first end-to-end pass: notify, work, sent."""

from __future__ import annotations

from kirim.model import DeliveryStatus
from kirim.testing import FlakyProvider
from kirim.worker import WorkerSettings


async def test_notify_then_worker_sends_once(make_app) -> None:
    """A notification is delivered once and its delivery ends sent."""
    provider = FlakyProvider(idempotent=False)
    app = await make_app(provider)
    n = await app.notify("48291", "1007", "push", {"title": "hi"})
    assert n.created
    worker = app.worker(settings=WorkerSettings(lease=10), worker_id="A")
    assert await worker.run_once() == 1
    record = await app.get(n.delivery_id)
    delivery, job, attempts = record.delivery, record.job, record.attempts
    assert delivery.status is DeliveryStatus.SENT
    assert job.status == "completed"
    assert [a.status for a in attempts] == ["succeeded"]
    assert provider.received(n.idempotency_key) == 1
