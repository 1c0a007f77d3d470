"""The per-delivery values a worker makes, timed one by one: microseconds per call.

The claim decodes a delivery and a job from their row and makes their claimed copies
(``rows.evolve``); the worker routes the claim (``decisions.route``) and makes an
intent, a message, an outcome and a finish. Each is timed alone (best of
``--repeat`` runs of ``--number`` calls), to compare two trees of kirim by running
this file under each (``PYTHONPATH=/other/src``), in turns. Prints; asserts nothing.

    .venv/bin/python bench/values_bench.py
    PYTHONPATH=/work/main/src .venv/bin/python bench/values_bench.py
"""

from __future__ import annotations

import argparse
import json
import timeit
from collections.abc import Callable
from typing import Any

from kirim.model import AttemptStatus, DeliveryStatus, JobStatus
from kirim.providers.base import Message
from kirim.store.base import AttemptOutcome, Finish, Intent
from kirim.store.rows import delivery_from, evolve, job_of
from kirim.worker.decisions import route

ROW: dict[str, Any] = {
    "id": 1,
    "idempotency_key": "k" * 64,
    "event_id": "evt-1",
    "recipient": "user@example.com",
    "channel": "email",
    "payload": json.dumps({"subject": "hello", "n": 1}),
    "payload_hash": "h" * 64,
    "status": "pending",
    "claim_token": None,
    "claimed_by": None,
    "claim_expires_at": None,
    "provider_message_id": None,
    "doubt": None,
    "last_error": None,
    "created_at": 1.0,
    "updated_at": 1.0,
    "sent_at": None,
    "type": None,
    "recipient_id": None,
    "reason": None,
    "job_id": 5,
    "job_delivery_id": 1,
    "job_status": "queued",
    "job_run_at": 1.0,
    "job_attempts": 0,
    "job_max_attempts": 5,
    "job_lease_owner": None,
    "job_lease_token": None,
    "job_lease_expires_at": None,
    "job_last_error": None,
    "job_created_at": 1.0,
    "job_updated_at": 1.0,
}


def cases() -> dict[str, Callable[[], object]]:
    delivery = delivery_from(ROW)
    job = job_of(ROW)
    assert job is not None
    outcome = AttemptOutcome(
        provider_request_id="req-1",
        status=AttemptStatus.SUCCEEDED,
        provider_message_id="m-1",
        error=None,
        completed_at=2.0,
    )
    return {
        "delivery_from (row -> Delivery)": lambda: delivery_from(ROW),
        "job_of (row -> Job)": lambda: job_of(ROW),
        "evolve Delivery (claimed copy)": lambda: evolve(
            delivery,
            status=DeliveryStatus.PROCESSING,
            claim_token="t",
            claimed_by="w",
            claim_expires_at=2.0,
            updated_at=1.0,
        ),
        "evolve Job (leased copy)": lambda: evolve(
            job,
            status=JobStatus.RUNNING,
            attempts=1,
            lease_owner="w",
            lease_token="t",
            lease_expires_at=2.0,
            updated_at=1.0,
        ),
        "route (first attempt)": lambda: route(("email",), (), ()),
        "Intent": lambda: Intent(
            delivery_id=1,
            job_id=5,
            token="t",
            number=1,
            provider_request_id="req-1",
            worker_id="w",
            requested_at=1.0,
            send_deadline=2.0,
            settles_at=3.0,
            provider="email",
        ),
        "Message": lambda: Message(
            delivery_id=1,
            idempotency_key="k",
            provider_request_id="req-1",
            event_id="evt-1",
            recipient="user@example.com",
            channel="email",
            payload=None,
            attempt=1,
            type=None,
            recipient_id=None,
        ),
        "Finish": lambda: Finish(
            reason=None,
            delivery_id=1,
            job_id=5,
            token="t",
            now=1.0,
            attempt=outcome,
            delivery_status=DeliveryStatus.SENT,
            doubt=None,
            provider_message_id="m-1",
            error=None,
            job_status=JobStatus.COMPLETED,
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    for name, call in cases().items():
        best = min(timeit.repeat(call, number=args.number, repeat=args.repeat))
        print(f"{best / args.number * 1e6:6.2f} us  {name}")


if __name__ == "__main__":
    main()
