"""What one worker did, counted as it went."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kirim.model import DeliveryStatus, Doubt, JobStatus
from kirim.store.base import Finish


@dataclass(slots=True)
class WorkerStats:
    claimed: int = 0
    noops: int = 0
    #: deliveries the claim-time check of their recipients' preferences suppressed
    suppressed: int = 0
    requests: int = 0
    sent: int = 0
    failed: int = 0
    retries: int = 0
    dead_lettered: int = 0
    in_doubt_seen: int = 0
    assumed_sent: int = 0
    held: int = 0
    claims_lost: int = 0
    stale_rejected: int = 0
    late_successes: int = 0
    #: committed intents not sent: their deadline passed or their lease was lost first
    not_sent: int = 0
    leases_expired: int = 0
    errors: int = 0

    def count(self, delivery: DeliveryStatus | None, job: JobStatus | None, finish: Finish) -> None:
        if delivery is DeliveryStatus.SENT:
            self.sent += 1
            if finish.doubt is Doubt.ASSUMED_SENT:
                self.assumed_sent += 1
        elif delivery is DeliveryStatus.FAILED:
            self.failed += 1
        elif delivery is DeliveryStatus.IN_DOUBT:
            self.held += 1
        if job is JobStatus.RETRY_SCHEDULED:
            self.retries += 1
        elif job is JobStatus.DEAD:
            self.dead_lettered += 1

    def as_dict(self) -> dict[str, int]:
        return asdict(self)
