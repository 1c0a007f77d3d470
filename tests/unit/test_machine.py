"""The delivery's state machine: one edge table that the code, the docs and the store
agree with."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from kirim import machine
from kirim.model import AT_REST, Delivery, DeliveryStatus, Doubt, Job, JobStatus
from record_kit import delivery_row, job_row

DESIGN = Path(__file__).parents[2] / "docs" / "design.md"
ALL = frozenset(DeliveryStatus)


def test_every_status_is_reached_by_some_edge() -> None:
    """Each status is the target of an edge (pending of a reopening or a retry too)."""
    assert {e.target for e in machine.EDGES} == ALL


def test_no_worker_edge_leaves_a_status_at_rest() -> None:
    """At rest means no worker acts on it: no claim, finish or reaper edge leaves it."""
    workers = {machine.By.CLAIM, machine.By.WORKER, machine.By.REAPER}
    left = {e.source for e in machine.EDGES if e.by in workers}
    assert not left & AT_REST
    # the rest: waiting for a worker, being sent, or held for an operator
    assert {
        DeliveryStatus.PENDING,
        DeliveryStatus.PROCESSING,
        DeliveryStatus.IN_DOUBT,
    } == ALL - AT_REST


def test_terminal_statuses_are_the_ones_no_edge_leaves() -> None:
    """Delivered never changes; an assumed sent can reopen, and a late success is a fact
    even for a suppressed delivery, so neither is terminal although both are at rest."""
    assert {DeliveryStatus.DELIVERED} == machine.TERMINAL
    assert machine.is_edge(DeliveryStatus.SENT, DeliveryStatus.PENDING)


def test_check_logs_a_change_that_is_not_an_edge(edges_known: Any) -> None:
    """A delivered delivery going back to pending is no edge: check logs it, and the
    suite's fixture (tests/conftest.py) would fail the test that made it."""
    assert not machine.check(7, "delivered", "pending", "a test")
    assert machine.check(7, "pending", "processing", "a test")
    assert edges_known.unknown == ["delivered -> pending (delivery 7)"]
    edges_known.unknown.clear()


@pytest.mark.parametrize("source", sorted(DeliveryStatus))
@pytest.mark.parametrize("target", sorted(DeliveryStatus))
def test_check_by_names_agrees_with_the_edge_table(
    source: DeliveryStatus, target: DeliveryStatus, edges_known: Any
) -> None:
    """Checked by the names rows hold (no member made), a change is an edge exactly when
    ``is_edge`` says so of the members."""
    assert machine.check(1, str(source), str(target), "a test") == machine.is_edge(source, target)
    edges_known.unknown.clear()


def test_check_refuses_a_name_that_is_no_status() -> None:
    with pytest.raises(ValueError, match="bogus"):
        machine.check(1, "bogus", "bogus", "a test")


def _delivery(
    status: DeliveryStatus, *, doubt: Doubt | None = None, claimed: bool = False
) -> Delivery:
    return delivery_row(
        recipient="r", status=status, doubt=doubt, claim_token="t" if claimed else None
    )


def _job(status: JobStatus) -> Job:
    return job_row(status=status, attempts=1)


@pytest.mark.parametrize("status", sorted(DeliveryStatus))
def test_the_verbs_take_only_edges(status: DeliveryStatus) -> None:
    """Whatever the operator may do to a delivery is an edge of the table: a cancel ends
    in canceled, a retry in pending."""
    d = _delivery(status)
    if machine.can_cancel(d):
        assert machine.is_edge(status, DeliveryStatus.CANCELED)
    if machine.can_retry(d, [_job(JobStatus.DEAD)]):
        assert machine.is_edge(status, DeliveryStatus.PENDING)


def test_cancel_and_retry_as_the_operator_sees_them() -> None:
    """A delivery in flight is not canceled; one whose claim was revoked is; only a dead
    letter is retried."""
    assert not machine.can_cancel(_delivery(DeliveryStatus.PROCESSING, claimed=True))
    assert machine.can_cancel(_delivery(DeliveryStatus.PROCESSING))
    assert not machine.can_cancel(_delivery(DeliveryStatus.SENT))
    failed = _delivery(DeliveryStatus.FAILED)
    assert machine.can_retry(failed, [_job(JobStatus.DEAD)])
    assert not machine.can_retry(failed, [_job(JobStatus.RETRY_SCHEDULED), None])
    assert machine.can_reconcile(_delivery(DeliveryStatus.SENT, doubt=Doubt.ASSUMED_SENT))
    assert machine.reopens(_delivery(DeliveryStatus.IN_DOUBT, doubt=Doubt.HELD))
    assert not machine.reopens(_delivery(DeliveryStatus.SENT, doubt=Doubt.RESOLVED))


def test_design_doc_shows_the_table_as_it_is() -> None:
    """docs/design.md's diagram is kirim.machine.mermaid(), so the doc cannot drift."""
    found = re.search(r"```mermaid\n(.*?)\n```", DESIGN.read_text(), re.S)
    assert found is not None, "docs/design.md has no mermaid diagram"
    assert found.group(1) == machine.mermaid()


async def test_the_store_checks_every_change_it_writes(
    make_app: Any, edges_known: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With processing -> sent taken out of the table, a plain send through the worker
    is reported as an unknown edge by the store's transaction (both backends)."""
    pairs = machine._PAIRS - {(DeliveryStatus.PROCESSING, DeliveryStatus.SENT)}
    monkeypatch.setattr(machine, "_PAIRS", pairs)
    app = await make_app()
    await app.notify("e1", "r1", "push", {"title": "hi"})
    await app.worker().run_once()
    assert [u.split(" (")[0] for u in edges_known.unknown] == ["processing -> sent"]
    edges_known.unknown.clear()
