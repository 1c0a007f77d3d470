"""The worker: it claims jobs, runs each delivery's protocol and keeps its leases.

- ``loop``: the ``Worker`` (its run loop, claims, concurrency, drain and shutdown);
- ``context``: what its roles share (``WorkerContext``), the work in flight among it
  (``InFlight``, its one owner);
- ``delivery``: one delivery's protocol (``Deliverer``: intent, send, classify, commit);
- ``leases``: the heartbeat and the reaper's rounds (expired leases, gauges, retention);
- ``decisions``: the pure decisions (retry, dead letter, in doubt);
- ``batching``: intents and outcomes of concurrent deliveries share transactions;
- ``settings``, ``stats``, ``cutoff``: its settings, counters and the request timeout;
- ``checkpoint``: the ``Checkpoint`` hook a test (``kirim.testing``) may implement.
"""

from kirim.worker.loop import Worker
from kirim.worker.settings import WorkerSettings, default_worker_id

__all__ = ["Worker", "WorkerSettings", "default_worker_id"]
