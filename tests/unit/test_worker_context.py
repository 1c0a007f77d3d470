"""The worker's context: its roles share one context, and the work in flight one owner."""

from __future__ import annotations

import dataclasses
import inspect

from kirim.store.base import Claim, ClaimKind
from kirim.worker.context import InFlight
from kirim.worker.delivery import Deliverer
from kirim.worker.leases import Heartbeat, Reaper
from kirim.worker.prepare import Prepare
from record_kit import claimed_rows


def _claim(job_id: int, kind: ClaimKind = ClaimKind.CLAIMED) -> Claim:
    """A claim of job ``job_id`` (its delivery has the same id)."""
    delivery, job = claimed_rows(job_id)
    return Claim(kind=kind, job=job, delivery=delivery, token=f"t{job_id}", now=50.0)


def test_a_claimed_job_has_its_lease_renewed_and_a_busy_one_none() -> None:
    """A claimed job's lease is renewed; a busy or no-op claim holds no lease."""
    work = InFlight()
    work.start(_claim(1), asked=5.0)
    work.start(_claim(2, ClaimKind.BUSY), asked=6.0)
    assert [lease.job_id for lease in work.leases()] == [1]
    assert work.claimed_at(1, default=0.0) == 5.0
    assert work.claimed_at(2, default=0.0) == 6.0
    assert work.claimed_at(3, default=-1.0) == -1.0


def test_a_failed_renewal_is_a_takeover_only_while_the_job_is_in_flight() -> None:
    """A lease that failed to renew is lost, unless its job is being committed."""
    work = InFlight()
    work.start(_claim(1), asked=0.0)
    work.start(_claim(2), asked=0.0)
    one, two = work.leases()
    work.finishing(2)
    assert work.taken_over(one)
    assert not work.taken_over(two)
    assert work.is_lost(1)
    assert not work.is_lost(2)
    assert [lease.job_id for lease in work.leases()] == [2]
    assert not work.taken_over(one)  # already gone: not taken over twice


def test_a_revoked_claim_is_lost_and_a_finished_job_forgotten() -> None:
    """A job found revoked is lost until its task ends; then nothing of it is kept."""
    work = InFlight()
    work.start(_claim(1), asked=3.0)
    work.lose(1)
    assert work.is_lost(1)
    work.done(1)
    assert not work.is_lost(1)
    assert work.leases() == []
    assert work.claimed_at(1, default=0.0) == 0.0


def test_the_roles_take_the_context_and_a_handful_of_arguments() -> None:
    """The deliverer takes the context and at most three more arguments; the
    heartbeat, the reaper and the prepare step take the context (and its digests)."""
    for role, most in ((Deliverer, 4), (Heartbeat, 1), (Reaper, 1), (Prepare, 2)):
        params = list(inspect.signature(role.__init__).parameters)[1:]
        assert params[0] == "context", role
        assert len(params) <= most, (role, params)


async def test_the_roles_read_the_context_instead_of_copying_its_fields(make_app) -> None:
    """No role keeps its own copy of a field of the worker's context: each reads it
    from the one context (so a role cannot go on with a stale clock or store)."""
    app = await make_app()
    worker = app.worker(worker_id="A")
    context = worker.context
    shared = {
        id(getattr(context, f.name)): f.name
        for f in dataclasses.fields(context)
        if getattr(context, f.name) is not None
    }
    deliverer = worker._deliverer
    for role in (deliverer, deliverer.prepare, worker._heartbeat, worker._reaper):
        assert role.context is context, role
        copied = [
            (name, shared[id(value)])
            for name, value in vars(role).items()
            if name != "context" and id(value) in shared
        ]
        assert not copied, (role, copied)
