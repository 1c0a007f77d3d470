"""One simulation: real worker processes, a real receiver, real faults, one database.

The harness enqueues the notifications, starts ``workers`` processes (``kirim worker
--burst`` or the naive worker), and, while they deliver to a loopback ``Receiver``,
injects the faults of the options: SIGKILLs (the worker is replaced by a fresh one)
and SIGSTOP/SIGCONT stalls longer than the lease, each spread over the run by
progress and aimed at a worker that has requests in flight at the receiver; the
receiver itself lets some calls time out after accepting them and answers some with
a 503. With ``clock_skew`` each worker process runs on its own clock, off by a
seeded draw in ±clock_skew (kirim's keeps the database's time for leases; the naive
flow trusts its own); with ``lookup`` kirim's channel asks the receiver's
``/lookup/{key}`` when in doubt; with ``channel = "smtp"`` the workers send email to
an ``SmtpReceiver`` (aiosmtpd) instead. When every worker has exited (or the deadline
passed), the receiver's counts and the database's records make the result. Every
process started is ended in a ``finally`` (stopped ones get SIGCONT before SIGKILL).

On PostgreSQL each run gets a throw-away database ``kirim_sim_<hex>`` on the given
server, created at the start and dropped at the end; the database named in the URL
is only used to connect and is never written to.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from kirim.chaos import Report, report_of, tally
from kirim.config import load_config
from kirim.devtools.receiver import Behaviour, Receiver
from kirim.devtools.services.base import ServiceFake
from kirim.engine import Kirim, NotifyRequest
from kirim.errors import ConfigError
from kirim.keys import default_key
from kirim.operations import EVERY
from kirim.simulate import naive, services
from kirim.simulate.fleet import Fleet
from kirim.simulate.options import STRATEGIES, SimOptions
from kirim.simulate.result import SimResult, percentile, rounded
from kirim.simulate.skew import Offsets
from kirim.simulate.smtp_receiver import SmtpReceiver

Progress = Callable[[int, int], None]
#: the webhook receiver, the SMTP server of ``--channel smtp``, or a service fake (the
#: same counts)
AnyReceiver = Receiver | SmtpReceiver | ServiceFake
_TICK = 0.02


# -- databases -------------------------------------------------------------------------


def backend_of(url: str | None) -> str:
    return "sqlite" if url is None or url.startswith("sqlite:") else "postgres"


@contextlib.contextmanager
def scratch_database(url: str | None, folder: Path) -> Iterator[str]:
    """A fresh database for one run: a SQLite file in ``folder``, or a throw-away
    PostgreSQL database ``kirim_sim_<hex>`` on the server of ``url`` (dropped after)."""
    if url is None:
        path = folder / "simulate.db"
        for suffix in ("", "-wal", "-shm"):  # left in a --logs folder used before
            path.with_name(path.name + suffix).unlink(missing_ok=True)
        yield f"sqlite:///{path}"
        return
    if url.startswith("sqlite:"):
        raise ConfigError(
            "--database takes a postgresql:// URL (SQLite runs on a temporary file by default)"
        )
    if not url.startswith(("postgresql:", "postgres:")):
        raise ConfigError(f"unsupported database URL {url!r}; use postgresql://user@host/db")
    try:
        import psycopg

        from kirim.store.postgres import postgres_conninfo, redact
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigError(
            "PostgreSQL needs the postgres extra: pip install 'kirim[postgres]'"
        ) from exc
    conninfo, _ = postgres_conninfo(url)
    name = f"kirim_sim_{secrets.token_hex(4)}"
    try:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(
            f"cannot create a throw-away database on {redact(url)}: {first} "
            "(the user needs CREATEDB)"
        ) from None
    parts = urlsplit(url)
    try:
        yield urlunsplit(parts._replace(path=f"/{name}"))
    finally:
        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as admin,
        ):
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _requests(n: int, channel: str = "webhook") -> list[tuple[str, str, str, dict[str, Any]]]:
    """(event, recipient, channel, payload) of the run: pushes, or emails over SMTP."""
    if channel == "smtp":
        return [
            (
                f"order-{i}",
                f"user-{i % 97}@example.test",
                "email",
                {"subject": f"Your order {i} shipped", "text": f"Order {i} is on its way."},
            )
            for i in range(n)
        ]
    return [
        (f"order-{i}", f"user-{i % 97}", "push", {"title": "Your order shipped", "order": i})
        for i in range(n)
    ]


def _mailbox_keys(opts: SimOptions) -> Callable[[str, str], str]:
    """How the SMTP receiver tells notifications apart, as a user would: recipient and
    subject (never anything kirim adds), mapped to the notification's key."""
    keys = {
        (r, p["subject"]): default_key(e, r, c)
        for e, r, c, p in _requests(opts.notifications, "smtp")
    }
    return lambda recipient, subject: keys.get((recipient, subject), "")


# -- the two strategies ----------------------------------------------------------------


@dataclass
class _Side:
    """One strategy on one database: what to enqueue, how to start a worker, what happened."""

    opts: SimOptions
    database: str
    url: str  # the receiver's
    lookup_url: str  # the receiver's GET /lookup/{key}
    folder: Path  # configs and logs
    logs: bool  # workers log at info level (else warnings only)
    fake: Any = None  # the service fake of --channel apns|fcm|webpush|sms

    def items(self) -> list[tuple[str, str, str, dict[str, Any]]]:
        """(event, recipient, channel, payload) of every notification of the run."""
        kind = self.opts.channel
        if kind in services.PROVIDERS:
            return services.requests(self.opts.notifications, kind, self.fake)
        return _requests(self.opts.notifications, kind)

    def service_table(self) -> dict[str, Any]:
        """The service channel's options for the fake (written once per run)."""
        cached: dict[str, Any] | None = getattr(self, "_table", None)
        if cached is None:
            o = self.opts
            cached = services.options(o.channel, self.fake, self.folder, o.provider_timeout)
            self._table = cached
        return cached


class _KirimSide(_Side):
    """kirim's own worker: ``python -m kirim worker --burst`` with one config per worker."""

    def config(self, worker_id: str | None) -> Path:
        o = self.opts
        who = json.dumps(worker_id)
        path = self.folder / f"kirim-{worker_id or 'base'}.toml"
        common = (
            f"timeout = {o.provider_timeout}\nidempotent = {str(o.idempotent).lower()}\n"
            f'on_unknown = "{o.on_unknown.value}"\n'
        )
        if o.channel in services.PROVIDERS:  # the worker's id in its User-Agent
            name = "sms" if o.channel == "sms" else "push"
            channel = (
                f"[channels.{name}]\n"
                + services.toml_lines(self.service_table())
                + f'on_unknown = "{o.on_unknown.value}"\n'
                + ("" if worker_id is None else f"user_agent = {who}\n")
            )
        elif o.channel == "smtp":  # the worker's id as its EHLO name: the faults aim by it
            server = urlsplit(self.url)
            channel = (
                f'[channels.email]\nprovider = "smtp"\nhost = "{server.hostname}"\n'
                f'port = {server.port}\nsecurity = "none"\nfrom = "Shop <shop@example.com>"\n'
                + common
                + ("" if worker_id is None else f"local_hostname = {who}\n")
            )
        else:
            headers = "" if worker_id is None else f"headers = {{ X-Worker-Id = {who} }}\n"
            channel = (
                f'[channels.push]\nprovider = "webhook"\nurl = {json.dumps(self.url)}\n'
                + common
                + headers
                + (
                    f"lookup = true\nlookup_url = {json.dumps(self.lookup_url)}\n"
                    if o.lookup
                    else ""
                )
            )
        path.write_text(
            f"database = {json.dumps(self.database)}\n"
            f"[worker]\nlease = {o.lease}\nmax_attempts = {o.max_attempts}\n"
            f"concurrency = {o.concurrency}\npoll_interval = 0.1\nbackoff_base = 0.05\n"
            "backoff_max = 0.5\nshutdown_grace = 2\n" + channel
        )
        return path

    async def prepare(self) -> None:
        app = Kirim(load_config(self.config(None), database=self.database))
        await app.open(migrate=True)
        try:
            await app.notify_many(
                [
                    NotifyRequest(event_id=e, recipient=r, channel=c, payload=p)
                    for e, r, c, p in self.items()
                ]
            )
        finally:
            await app.close()

    def argv(self, worker_id: str, offset: float) -> list[str]:
        level = "info" if self.logs else "warning"
        config = str(self.config(worker_id))
        argv = [sys.executable, "-m", "kirim", "--config", config, "--database", self.database]
        argv += ["--log-level", level, "worker", "--burst", "--worker-id", worker_id]
        return argv + ([f"--clock-offset={offset!r}"] if offset else [])

    async def collect(self) -> list[Report]:
        app = Kirim(load_config(self.config(None), database=self.database))
        await app.open()
        out: list[Report] = []
        try:
            cursor: int | None = None
            while True:  # every delivery, a page (deliveries, jobs, attempts) at a time
                page = await app.records(EVERY, cursor=cursor, limit=500)
                out += [report_of(r.delivery, r.job, r.attempts) for r in page.records]
                if (cursor := page.next_cursor) is None:
                    break
        finally:
            await app.close()
        return out


class _NaiveSide(_Side):
    """The write-up's flow: ``python -m kirim.simulate.naive`` on its own tables."""

    async def prepare(self) -> None:
        db = naive.NaiveDb(self.database).connect()
        try:
            db.create_tables()
            naive.enqueue(db, self.items(), attempts=self.opts.max_attempts)
        finally:
            db.close()

    def argv(self, worker_id: str, offset: float) -> list[str]:
        o = self.opts
        argv = [sys.executable, "-m", "kirim.simulate.naive", "--database", self.database]
        argv += ["--url", self.url, "--worker-id", worker_id, "--lease", str(o.lease)]
        argv += ["--concurrency", str(o.concurrency), "--timeout", str(o.provider_timeout)]
        argv += ["--burst"] + ([f"--clock-offset={offset!r}"] if offset else [])
        argv += ["--idempotent"] if o.idempotent else []
        if o.channel in services.PROVIDERS:
            table = dict(self.service_table())
            path = self.folder / "naive-service.json"
            path.write_text(json.dumps(table))
            argv += ["--service", str(path)]
        return argv + ([] if self.logs else ["--quiet"])

    async def collect(self) -> list[Report]:
        db = naive.NaiveDb(self.database).connect()
        try:
            records = naive.collect(db)
        finally:
            db.close()
        return [
            Report(
                key=r.key,
                created_at=r.created_at,
                unfinished=r.status == "pending",
                failed=r.status == "failed",
                retries=max(0, r.attempts - 1),
                dead=r.job_status == "dead",
            )
            for r in records
        ]


# -- worker processes ------------------------------------------------------------------


def fault_plan(opts: SimOptions, rng: random.Random) -> list[tuple[int, str]]:
    """(delivered count to wait for, "kill" or "stall"), spread evenly over the run."""
    kinds = ["kill"] * opts.kills + ["stall"] * opts.stalls
    rng.shuffle(kinds)
    n = len(kinds)
    return [(math.ceil(opts.notifications * (i + 1) / (n + 1)), k) for i, k in enumerate(kinds)]


# -- one run ---------------------------------------------------------------------------


def simulate(
    opts: SimOptions,
    *,
    progress: Progress | None = None,
    logs: Path | None = None,
    empty_database: str | None = None,
) -> SimResult:
    """Run one simulation and return what the receiver and the database saw.

    ``logs``: a folder that keeps the workers' logs (default: a temporary one).
    ``empty_database``: run in this database as it is (it must be empty, as the
    tests' fresh ones are) instead of making a fresh one from ``opts.database``.
    """
    opts.validate()
    rng = random.Random(opts.seed)
    behaviour = Behaviour(
        hang_rate=opts.timeout_rate,
        hang_s=opts.hang_s,
        error_rate=opts.error_rate,
        honours_keys=opts.idempotent,
        latency=opts.latency.sample,
    )
    with contextlib.ExitStack() as stack:
        if logs is None:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kirim-sim-")))
        else:
            folder = logs
            folder.mkdir(parents=True, exist_ok=True)
        database = empty_database or stack.enter_context(scratch_database(opts.database, folder))
        receiver_seed = rng.randrange(1 << 30)
        receiver: AnyReceiver
        fake = None
        if opts.channel in services.PROVIDERS:
            faults = services.behaviour_of(opts.timeout_rate, opts.error_rate, behaviour)
            fake = stack.enter_context(
                services.fake_for(opts.channel, faults, receiver_seed, folder)
            )
            receiver = fake
        elif opts.channel == "smtp":
            mailbox = SmtpReceiver(behaviour, seed=receiver_seed, identify=_mailbox_keys(opts))
            receiver = stack.enter_context(mailbox)
        else:
            receiver = stack.enter_context(Receiver(behaviour, seed=receiver_seed))
        side_type: type[_KirimSide | _NaiveSide] = (
            _KirimSide if opts.strategy == "kirim" else _NaiveSide
        )
        side = side_type(
            opts, database, receiver.url, receiver.lookup_url, folder, logs is not None, fake
        )
        if fake is not None:  # the device tells notifications apart by what it shows
            fake.identify = services.identify(side.items(), opts.channel)
        asyncio.run(side.prepare())
        fleet = Fleet(side.argv, folder, Offsets(opts.clock_skew, opts.seed))
        started = time.monotonic()
        try:
            timed_out = _drive(opts, rng, fleet, receiver, progress, started)
        finally:
            fleet.close()
        seconds = time.monotonic() - started
        outcomes = asyncio.run(side.collect())
        result = _result(opts, database, receiver, fleet, outcomes, seconds, timed_out)
    return result


def _drive(
    opts: SimOptions,
    rng: random.Random,
    fleet: Fleet,
    receiver: AnyReceiver,
    progress: Progress | None,
    started: float,
) -> bool:
    """Run the workers to the end, injecting the faults; True if the deadline passed."""
    plan = fault_plan(opts, rng)
    for _ in range(opts.workers):
        fleet.start()
    while fleet.busy():
        now = time.monotonic()
        if now - started > opts.deadline:
            return True
        fleet.tick(now)
        done = receiver.delivered()
        if progress is not None:
            progress(done, opts.notifications)
        while plan and plan[0][0] <= done:
            targets = [w for w in fleet.running() if receiver.in_flight_by[w] > 0]
            if not targets:
                break  # try again on the next tick: the fault must hit a send in flight
            target = rng.choice(targets)
            if plan.pop(0)[1] == "kill":
                fleet.kill(target)
                fleet.start()  # a fresh worker, so the run can finish
            else:
                fleet.stall(target, now + opts.lease * rng.uniform(1.5, 2.5))
        time.sleep(_TICK)
    if progress is not None:
        progress(receiver.delivered(), opts.notifications)
    return False


def _result(
    opts: SimOptions,
    database: str,
    receiver: AnyReceiver,
    fleet: Fleet,
    outcomes: list[Report],
    seconds: float,
    timed_out: bool,
) -> SimResult:
    found = tally(outcomes, receiver.requests, receiver.copies())
    delivered = found.delivered
    latencies = [
        receiver.first_seen[o.key] - o.created_at for o in outcomes if o.key in receiver.first_seen
    ]
    return SimResult(
        strategy=opts.strategy,
        backend=backend_of(database),
        seed=opts.seed,
        idempotent=opts.idempotent,
        on_unknown=opts.on_unknown.value,
        lease=opts.lease,
        latency=str(opts.latency),
        notifications=opts.notifications,
        delivered=delivered,
        duplicate_requests=receiver.duplicates(),
        duplicates=found.duplicates,
        lost=found.lost,
        in_doubt=found.in_doubt,
        resolved=found.resolved,
        unreported_in_doubt=found.unreported_in_doubt,
        failed=found.failed,
        unfinished=found.unfinished,
        retries=found.retries,
        dead_lettered=found.dead_lettered,
        seconds=round(seconds, 3),
        throughput_per_s=round(delivered / seconds, 1) if seconds > 0 else 0.0,
        latency_p50_s=rounded(percentile(latencies, 0.50)),
        latency_p99_s=rounded(percentile(latencies, 0.99)),
        faults={
            "kills": fleet.kills,
            "stalls": fleet.stalls,
            "timeouts": receiver.injected["timeouts"],
            "errors": receiver.injected["errors"],
        },
        workers_started=len(fleet.procs),
        worker_crashes=list(fleet.crashes),
        timed_out=timed_out,
        clock_skew=opts.clock_skew,
        clock_offsets=dict(fleet.clock_offsets) if opts.clock_skew else {},
        lookup=opts.lookup and opts.strategy == "kirim",
        lookups=dict(receiver.lookups),
        channel=opts.channel,
    )


def sweep(
    opts: SimOptions,
    ratios: Sequence[float],
    *,
    on_run: Callable[[float, SimResult], None] | None = None,
    progress: Progress | None = None,
) -> list[tuple[float, SimResult]]:
    """Both strategies at each lease = ratio × the latency's median; the other knobs as given."""
    if opts.latency.median <= 0:
        raise ValueError("a sweep needs a latency with a median above 0")
    runs = []
    for ratio in ratios:
        lease = ratio * opts.latency.median
        for strategy in STRATEGIES:
            result = simulate(replace(opts, strategy=strategy, lease=lease), progress=progress)
            runs.append((ratio, result))
            if on_run is not None:
                on_run(ratio, result)
    return runs
