"""The streaming detector: follows each notification's chain and reports incidents.

Only *open* notifications hold state.  A finished chain (no request in flight, every provider
success followed by a status write) idle for ``window_s`` of log time or ``window_lines``
lines is finalized: incidents emitted, state dropped.  Unfinished ones are parked and forced
closed after ``stale_s`` / ``stale_lines``.  A bounded LRU of closed notifications' requests
lets a late retry still be matched against what came before."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kirim.analyze.parse import EVENTS, LineParser, Record, parse_ts
from kirim.analyze.report import (
    JSON,
    Incident,
    IncidentKind,
    Report,
    Tally,
    iso,
    label,
    unattributed,
)

SUCCESS = frozenset({"success", "succeeded", "ok", "sent", "delivered", "accepted"})
SENT_STATUSES = frozenset({"sent", "confirmed", "delivered"})
#: how kirim's provider seam begins the error of a request that never left the host
#: (refused at connect, not buildable): the log's ``provider_response error="not sent: …"``
NOT_SENT = "not sent"
#: the events whose lines are evidence: kept in an incident's timeline beyond its limit
EVIDENCE = frozenset(
    {
        "provider_request", "provider_response", "db_update", "lease_expired", "claim_lost",
        "stale_write_rejected", "in_doubt",
    }
)  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class AnalyzeOptions:
    """Tuning of the analyzer; the defaults suit kirim's own logs."""

    late_after_s: float = 1.0
    field_map: Mapping[str, str] = field(default_factory=dict)
    window_s: float = 10.0
    window_lines: int = 20_000
    stale_s: float = 900.0
    stale_lines: int = 1_000_000
    remember: int = 20_000
    max_incidents: int = 10_000
    timeline_limit: int = 40
    worst_gaps: int = 5


class _Req:
    """One outbound provider request and what became of it."""

    __slots__ = (
        "answered", "attempt", "idem", "inflight", "msg_id", "ok", "result", "rid", "t_req",
        "t_resp", "worker", "written",
    )  # fmt: skip

    def __init__(self, rid: str, rec: Record, t: float | None) -> None:
        self.rid, self.t_req = rid, t
        self.attempt, self.worker = rec.get("attempt"), rec.get("worker_id")
        self.idem = rec.get("idempotency_key")
        self.answered = self.ok = self.inflight = self.written = False
        self.t_resp: float | None = None
        self.result: str | None = None
        self.msg_id: str | None = None

    def as_json(self) -> JSON:
        return {
            "request_id": self.rid,
            "attempt": label(self.attempt),
            "worker_id": self.worker,
            "requested_at": iso(self.t_req),
            "responded_at": iso(self.t_resp),
            "result": self.result,
            "provider_message_id": self.msg_id,
        }


class _State:
    """Everything known about one open notification (rare parts are tuples, grown on use)."""

    __slots__ = (
        "attempts", "awaiting", "dirty", "examples", "inflight", "jobs", "last_line", "last_t",
        "late", "lines", "missing", "nid", "overlaps", "reqs", "timeline",
    )  # fmt: skip

    def __init__(self, nid: str) -> None:
        self.nid = nid
        self.reqs: dict[str, _Req] = {}
        self.timeline: list[str] = []
        self.inflight = self.awaiting = self.lines = self.last_line = 0
        self.attempts: tuple[tuple[str | None, str | None], ...] = ()
        self.overlaps: tuple[tuple[_Req, str | None, str | None, float | None], ...] = ()
        self.late: tuple[tuple[_Req, float, float, str | None], ...] = ()
        self.missing: tuple[str, ...] = ()
        self.examples: tuple[str, ...] = ()
        self.jobs: tuple[str, ...] = ()
        self.dirty = False
        self.last_t: float | None = None


def _differs(a1: str | None, w1: str | None, a2: str | None, w2: str | None) -> bool:
    """True when two (attempt, worker) pairs are certainly different attempts."""
    return (a1 is not None and a2 is not None and a1 != a2) or (
        w1 is not None and w2 is not None and w1 != w2
    )


class Detector:
    """Feed lines one by one with :meth:`feed`, then call :meth:`finish` for the report."""

    def __init__(self, options: AnalyzeOptions | None = None) -> None:
        self.options = opts = options or AnalyzeOptions()
        self._parse = LineParser(opts.field_map).parse
        self._keep = opts.timeline_limit
        self._active: OrderedDict[str, _State] = OrderedDict()
        self._parked: OrderedDict[str, _State] = OrderedDict()
        self._jobs: dict[str, str] = {}
        self._closed_jobs: OrderedDict[str, str] = OrderedDict()  # only once jobs are needed
        self._closed: OrderedDict[str, dict[str, _Req]] = OrderedDict()
        self._via_job = False
        self._now = -math.inf
        self.lines = self.malformed = self.notifications = self.peak_open = 0
        self._tally = Tally(max_incidents=opts.max_incidents, worst_gaps=opts.worst_gaps)
        self._orphans: list[str] = []
        self._orphan_count = 0

    @property
    def open_notifications(self) -> int:
        """How many notifications currently hold state (active plus parked)."""
        return len(self._active) + len(self._parked)

    def feed(self, line: str) -> None:
        """Consume one log line."""
        self.lines = n = self.lines + 1
        if not n & 1023:
            self._sweep()
        rec = self._parse(line)
        if rec is None:
            self.malformed += 1
            return
        t: float | None = None
        stamp = rec.get("ts")
        if stamp is not None:
            t = parse_ts(stamp)
            if t is not None and t > self._now:
                self._now = t
        nid = rec.get("notification_id")
        job = rec.get("job_id")
        if nid is None:
            if job is not None:
                nid = self._jobs.get(job) or self._closed_jobs.get(job)
                self._via_job = True
            if nid is None:
                if job is not None or rec.get("event") in EVENTS:
                    self._orphan_count += 1
                    if len(self._orphans) < 3:
                        self._orphans.append(line.rstrip())
                return
        st = self._active.get(nid)
        if st is None:
            st = self._open(nid)
        else:
            self._active.move_to_end(nid)
        if job is not None and job not in st.jobs:
            self._jobs[job] = nid
            st.jobs += (job,)
        st.lines += 1
        st.last_line = n
        if t is not None:
            st.last_t = t
        event = rec.get("event")
        if len(st.timeline) < self._keep or (
            event in EVIDENCE and len(st.timeline) < self._keep * 8
        ):
            st.timeline.append(line)
        if event == "provider_request":
            self._on_request(st, rec, t, line)
        elif event == "provider_response":
            self._on_response(st, rec, t, line)
        elif event == "db_update":
            if st.awaiting:
                self._on_write(st, rec, t)
        elif event == "job_claimed":
            self._start(st, rec.get("attempt"), rec.get("worker_id"), t)

    def _open(self, nid: str) -> _State:
        st = self._parked.pop(nid, None)
        if st is None:
            st = _State(nid)
            prior = self._closed.pop(nid, None)
            if prior is None:
                self.notifications += 1
            else:
                st.reqs = prior
        self._active[nid] = st
        self.peak_open = max(self.peak_open, len(self._active) + len(self._parked))
        return st

    def _missing(self, st: _State, line: str, what: str) -> None:
        st.missing += (what,)
        if len(st.examples) < 3:
            st.examples += (line.rstrip(),)

    def _start(self, st: _State, attempt: str | None, worker: str | None, t: float | None) -> None:
        if (attempt, worker) in st.attempts:
            return
        st.attempts += ((attempt, worker),)
        if not st.inflight:
            return
        seen = {(o[0].attempt, o[0].worker, o[1], o[2]) for o in st.overlaps}
        for req in st.reqs.values():
            key = (req.attempt, req.worker, attempt, worker)
            if req.inflight and _differs(*key) and key not in seen:
                seen.add(key)
                st.overlaps += ((req, attempt, worker, t),)

    def _on_request(self, st: _State, rec: Record, t: float | None, line: str) -> None:
        rid = rec.get("provider_request_id")
        if rid is None:
            rid = f"(line {self.lines})"
            self._missing(st, line, "provider_request_id")
        elif rid in st.reqs:
            return
        req = _Req(rid, rec, t)
        if req.attempt is None and req.worker is None:
            self._missing(st, line, "attempt")
        if not any(not _differs(a, w, req.attempt, req.worker) for a, w in st.attempts):
            self._start(st, req.attempt, req.worker, t)
        st.reqs[rid] = req
        req.inflight = st.dirty = True
        st.inflight += 1

    def _on_response(self, st: _State, rec: Record, t: float | None, line: str) -> None:
        rid = rec.get("provider_request_id")
        req = st.reqs.get(rid) if rid is not None else None
        if req is None:
            attempt, worker = rec.get("attempt"), rec.get("worker_id")
            found = [
                r
                for r in st.reqs.values()
                if r.inflight and not _differs(r.attempt, r.worker, attempt, worker)
            ]
            if rid is None and found:
                req = found[0]
                if len(found) > 1:
                    self._missing(st, line, "provider_request_id")
            else:  # a response whose request we never saw: the request was still sent
                self._missing(st, line, "provider_request" if rid else "provider_request_id")
                req = _Req(rid or f"(line {self.lines})", rec, None)
                st.reqs[req.rid] = req
        if req.answered:
            return
        if req.inflight:
            req.inflight = False
            st.inflight -= 1
        if (rec.get("error") or "").startswith(NOT_SENT):
            # kirim's word that no byte of it left the host: a request that never was
            del st.reqs[req.rid]
            return
        st.dirty = req.answered = True
        req.t_resp = t
        req.result = result = rec.get("result")
        req.msg_id = msg = rec.get("provider_message_id")
        req.ok = result in SUCCESS if result is not None else msg is not None
        if req.ok:
            st.awaiting += 1
        self._tally.latency(rec.get("latency_s"), req.t_req, t)

    def _on_write(self, st: _State, rec: Record, t: float | None) -> None:
        status = rec.get("status")
        if status is not None and status not in SENT_STATUSES:
            return
        for req in st.reqs.values():
            if req.ok and not req.written:
                req.written = True
                if req.t_resp is not None and t is not None:
                    gap = t - req.t_resp
                    if gap > self.options.late_after_s:
                        st.late += ((req, t, gap, status),)
        st.awaiting = 0

    def _sweep(self) -> None:
        """Close idle notifications; pools are ordered by last touch, oldest first."""
        opts, n, now = self.options, self.lines, self._now
        for pool, lines, secs in (
            (self._active, opts.window_lines, opts.window_s),
            (self._parked, opts.stale_lines, opts.stale_s),
        ):
            while pool:
                st = next(iter(pool.values()))
                idle_t = now - st.last_t if st.last_t is not None else 0.0
                if n - st.last_line <= lines and idle_t <= secs:
                    break
                pool.popitem(last=False)
                if pool is self._active and (st.inflight or st.awaiting):
                    self._parked[st.nid] = st
                else:
                    self._finalize(st)

    def _finalize(self, st: _State) -> None:
        nid, reqs, cap = st.nid, st.reqs, self.options.remember
        if st.overlaps or st.late or st.awaiting or st.missing or len(reqs) > 1:
            for incident in self._incidents_of(st):
                self._tally.add(incident)
        if st.inflight or st.awaiting:  # reported once; a reopened chain starts clean
            for req in reqs.values():
                req.inflight = False
                req.written = req.written or req.ok
        for job in st.jobs:
            if self._jobs.get(job) == nid:
                del self._jobs[job]
            if self._via_job:
                self._closed_jobs[job] = nid
                if len(self._closed_jobs) > cap:
                    self._closed_jobs.popitem(last=False)
        self._closed[nid] = reqs
        if len(self._closed) > cap:
            self._closed.popitem(last=False)

    def _incidents_of(self, st: _State) -> list[Incident]:
        timeline = tuple(line.rstrip() for line in st.timeline)
        if st.lines > len(timeline):
            timeline += (f"... {st.lines - len(timeline)} more line(s) not kept",)

        def incident(
            kind: IncidentKind,
            reqs: Sequence[_Req],
            evidence: dict[str, JSON],
            proven: bool | None = None,
            attempts: Sequence[str | None] = (),
        ) -> Incident:
            attempts = attempts or [r.attempt for r in reqs]
            return Incident(
                kind=kind,
                notification_id=st.nid,
                proven=proven,
                request_ids=tuple(r.rid for r in reqs),
                provider_message_ids=tuple(dict.fromkeys(r.msg_id for r in reqs if r.msg_id)),
                attempts=tuple(dict.fromkeys(a for a in attempts if a is not None)),
                evidence=evidence,
                timeline=timeline,
            )

        out: list[Incident] = []
        reqs = sorted(st.reqs.values(), key=lambda r: (r.t_req is None, r.t_req or 0.0))
        if st.dirty and len(reqs) >= 2:
            ok = [r for r in reqs if r.ok]
            ids = {r.msg_id or (f"idem:{r.idem}" if r.idem else f"req:{r.rid}") for r in ok}
            msgs = [r.msg_id for r in ok if r.msg_id]
            idems = {r.idem for r in reqs}
            evidence: dict[str, JSON] = {
                "succeeded": len(ok),
                "deduplicated_by_provider": len(set(msgs)) < len(msgs),
                "same_idempotency_key": len(idems) == 1 and None not in idems,
                "first_request_at": iso(reqs[0].t_req),
                "last_request_at": iso(reqs[-1].t_req),
                "requests": [r.as_json() for r in reqs],
            }
            out.append(incident("duplicate_request", reqs, evidence, proven=len(ids) >= 2))
        end = self._now if self._now > -math.inf else None
        for req, attempt, worker, t_start in st.overlaps:
            stop = req.t_resp if req.answered else end
            later = [
                r
                for r in reqs
                if r is not req and not _differs(r.attempt, r.worker, attempt, worker)
            ]
            evidence = {
                "earlier_attempt": label(req.attempt),
                "earlier_worker_id": req.worker,
                "later_attempt": label(attempt),
                "later_worker_id": worker,
                "earlier_request_at": iso(req.t_req),
                "later_started_at": iso(t_start),
                "earlier_response_at": iso(req.t_resp),
                "never_answered": not req.answered,
                "overlap_s": None if stop is None or t_start is None else round(stop - t_start, 3),
            }
            pair = (req.attempt, attempt)
            out.append(incident("overlapping_attempt", [req, *later], evidence, attempts=pair))
        writes: list[tuple[_Req, str | None, float | None, str | None]] = [
            (r, iso(t), round(gap, 3), status) for r, t, gap, status in st.late
        ]
        writes += [(r, None, None, None) for r in reqs if r.ok and not r.written]
        for req, written, gap, status in writes:
            evidence = {
                "provider_success_at": iso(req.t_resp),
                "status_written_at": written,
                "status": status,
                "gap_s": gap,
                "never": written is None,
                "late_after_s": self.options.late_after_s,
            }
            out.append(incident("late_status_write", [req], evidence))
        if st.missing:
            evidence = {
                "count": len(st.missing),
                "fields": list[JSON](dict.fromkeys(st.missing)),
                "examples": list[JSON](st.examples),
            }
            out.append(incident("missing_correlation", [], evidence))
        return out

    def finish(self) -> Report:
        """Close every open notification and return the report."""
        for pool in (self._active, self._parked):
            while pool:
                self._finalize(pool.popitem(last=False)[1])
        if self._orphan_count:
            self._tally.add(unattributed(self._orphan_count, self._orphans))
        return self._tally.build(
            lines=self.lines,
            malformed_lines=self.malformed,
            notifications=self.notifications,
            open_notifications_peak=self.peak_open,
        )
