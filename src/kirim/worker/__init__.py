"""The worker: it claims jobs, runs each delivery's protocol and keeps its leases.

- ``loop``: the ``Worker`` (claims, concurrency, drain and shutdown);
- ``decisions``: the pure decisions (retry, dead letter, in doubt);
- ``batching``: intents and outcomes of concurrent deliveries share transactions;
- ``settings``, ``stats``, ``cutoff``: its settings, counters and the send bound;
- ``checkpoint``: the ``Checkpoint`` hook a test (``kirim.testing``) may implement.
"""

from kirim.worker.loop import Worker
from kirim.worker.settings import WorkerSettings, default_worker_id

__all__ = ["Worker", "WorkerSettings", "default_worker_id"]
