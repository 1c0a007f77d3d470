"""What is wrong with a live kirim store, in plain words, with the fix.

Checks the schema, the UNIQUE index on the idempotency key (and duplicates it let
in), deliveries stuck in ``processing``, in-doubt deliveries waiting for an operator,
the dead letters, the lease against the providers' observed p99 latency, the
database clock against this host's, each channel's provider dedup window against
kirim's retry horizon, and the retention (``[retention] keep``) against both; what
the database keeps (replication mode, a pooler in front, intents found missing:
``kirim.doctor.database``).
Read-only: it never writes. The command is ``kirim.cli.doctor``.

Statuses: ``ok``, ``warning`` (worth a look), ``problem`` (exit 1), ``skipped``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from kirim.config import Config
from kirim.doctor.audit import (
    OK,
    PROBLEM,
    SKIPPED,
    WARNING,
    Check,
    audit_unique,
    plural,
)
from kirim.doctor.database import database_checks
from kirim.doctor.probes import Database
from kirim.errors import SchemaError
from kirim.store.base import SCHEMA_VERSION
from kirim.store.schema import parse_version

RECENT_ATTEMPTS = 1000  # the latency p99 is taken over this many recent attempts
SKEW_WARNING_S = 1.0
LISTED = 5  # ids named in a message


def _ids(rows: Sequence[dict[str, Any]], total: int) -> str:
    shown = ", ".join(str(r["id"]) for r in rows[:LISTED])
    return shown + (f" and {total - LISTED} more" if total > LISTED else "")


# -- kirim's own store -----------------------------------------------------------------


def diagnose(db: Database, config: Config, *, now: float) -> list[Check]:
    """Every check of a kirim store (its database already open as ``db``)."""
    checks = [_schema(db)]
    if checks[0].status is OK:
        table = db.table("kirim_deliveries")
        checks += audit_unique(db, table, ["idempotency_key"], name="unique_idempotency_key")
        checks += [
            _stuck(db, now, config.worker.lease),
            _in_doubt(db),
            _dead_letters(db),
            _lease_vs_latency(db, config.worker.lease),
        ]
    else:
        checks.append(Check("store", SKIPPED, "the other store checks need the schema"))
    checks += database_checks(db, config, has_schema=checks[0].status is OK)
    checks.append(_clock_skew(db, config.worker.lease))
    checks += _dedup_windows(config)
    checks.append(_retention(config))
    checks.append(_inbox(config))
    return checks


def _schema(db: Database) -> Check:
    present = db.named_scalar("doctor_has_meta")
    raw = db.named_scalar("doctor_schema_version") if present else None
    try:
        version = 0 if raw is None else parse_version(raw)
    except SchemaError as exc:
        return Check("schema", PROBLEM, str(exc), "restore the database from a backup")
    if version == SCHEMA_VERSION:
        return Check("schema", OK, f"schema version {version}")
    if version == 0:
        return Check("schema", PROBLEM, "no kirim schema in this database", "run `kirim init`")
    if version < SCHEMA_VERSION:
        return Check(
            "schema",
            PROBLEM,
            f"schema version {version}, this kirim needs {SCHEMA_VERSION}",
            "run `kirim init` to migrate",
        )
    return Check(
        "schema",
        PROBLEM,
        f"schema version {version} is newer than this kirim knows ({SCHEMA_VERSION})",
        "upgrade kirim",
    )


def _stuck(db: Database, now: float, lease: float) -> Check:
    """processing, claim expired for more than a lease, and no live lease holding it."""
    rows = db.named("doctor_stuck", {"before": now - lease, "now": now})
    if not rows:
        return Check("stuck_processing", OK, "no delivery is stuck in processing")
    orphans = [r for r in rows if r["job_status"] is None]
    total = len(rows)
    message = (
        f"{plural(total, 'delivery')} stuck in processing: claim expired over {lease:g} s "
        f"ago and no worker holds a lease on them (ids {_ids(rows, total)})"
    )
    fix = (
        "start a worker (`kirim worker`): its reaper returns expired leases to the queue and "
        "the next claim takes each delivery over under its channel's in-doubt policy, never "
        "a blind resend"
    )
    if orphans:
        message += (
            f"; {len(orphans)} of them with no active job at all, which no worker will "
            f"finish (ids {_ids(orphans, len(orphans))})"
        )
        fix += "; for those: `kirim status ID`, then `kirim cancel ID`"
    return Check("stuck_processing", PROBLEM, message, fix)


def _in_doubt(db: Database) -> Check:
    rows = db.named("doctor_in_doubt", {"limit": LISTED})
    if not rows:
        return Check("in_doubt", OK, "no delivery is waiting in doubt for an operator")
    total = int(db.named_scalar("doctor_in_doubt_count"))
    return Check(
        "in_doubt",
        WARNING,
        f"{plural(total, 'delivery')} in doubt, waiting for an operator: a request may have "
        f"reached the provider and its fate is unknown (ids {_ids(rows, total)})",
        "`kirim list --status in_doubt`; find out from the provider or the recipient whether "
        "each arrived, then `kirim dead-letter retry ID` (may arrive twice) or "
        "`kirim dead-letter cancel ID`",
    )


def _dead_letters(db: Database) -> Check:
    total = int(db.named_scalar("doctor_dead_count"))
    if total == 0:
        return Check("dead_letters", OK, "the dead-letter queue is empty")
    return Check(
        "dead_letters",
        WARNING,
        f"{plural(total, 'delivery')} dead-lettered (failed for good, out of attempts, or "
        "held in doubt)",
        "`kirim dead-letter list`, then `kirim dead-letter retry ID` or `… cancel ID`",
    )


def _lease_vs_latency(db: Database, lease: float) -> Check:
    rows = db.named("doctor_latencies", {"limit": RECENT_ATTEMPTS})
    samples = sorted(max(0.0, float(next(iter(r.values())))) for r in rows)
    if not samples:
        return Check("lease_vs_latency", SKIPPED, "no completed attempt yet to measure latency")
    p99 = samples[max(0, math.ceil(0.99 * len(samples)) - 1)]
    seen = f"provider latency p99 {p99:.3f} s over the last {plural(len(samples), 'attempt')}"
    if lease >= p99:
        return Check("lease_vs_latency", OK, f"lease {lease:g} s covers the {seen}")
    return Check(
        "lease_vs_latency",
        WARNING,
        f"lease {lease:g} s is shorter than the {seen}: those requests live on heartbeats "
        "alone, and a store hiccup longer than the lease hands them to another worker "
        "(in doubt)",
        f"set [worker] lease = {max(2 * p99, 1):.0f} (twice the p99) in the config",
    )


def _clock_skew(db: Database, lease: float) -> Check:
    if db.dialect == "sqlite":
        return Check(
            "clock_skew",
            SKIPPED,
            "SQLite: the database and its workers read one host's clock",
        )
    before = time.time()
    db_now = float(db.named_scalar("doctor_clock"))
    after = time.time()
    skew = db_now - (before + after) / 2
    message = f"database clock {skew:+.3f} s from this host's (±{(after - before) / 2:.3f} s)"
    fix = "run NTP (chrony, systemd-timesyncd) on the database host and every worker host"
    if abs(skew) > lease / 2:
        return Check(
            "clock_skew",
            PROBLEM,
            message + f": over half the lease ({lease:g} s); leases are judged by each "
            "worker's clock, so a worker this far off takes over leases still held",
            fix,
        )
    if abs(skew) > SKEW_WARNING_S:
        return Check(
            "clock_skew",
            WARNING,
            message + ": workers on hosts this far apart shorten or stretch each "
            "other's leases by as much",
            fix,
        )
    return Check("clock_skew", OK, message)


def retry_horizon(config: Config) -> float:
    """Seconds from the first request to the last retry at worst: the sum of the maximal
    backoffs (full jitter up to base * 2^(n-1), capped by backoff_max) between attempts."""
    w = config.worker
    return float(
        sum(
            min(w.backoff_max, w.backoff_base * 2.0 ** (n - 1))
            for n in range(1, config.max_attempts)
        )
    )


def _dedup_windows(config: Config) -> list[Check]:
    horizon = retry_horizon(config)
    declared = {n: c for n, c in config.channels.items() if c.dedup_window is not None}
    if not declared:
        return [
            Check(
                "dedup_window",
                SKIPPED,
                "no channel gives its provider's dedup_window (how long it remembers an "
                f"idempotency key); kirim's retry horizon is {horizon:g} s",
                "set dedup_window = SECONDS in a [channels.NAME] table to have it checked",
            )
        ]
    checks = []
    for name, channel in sorted(declared.items()):
        window = float(channel.dedup_window or 0)
        what = (
            f"channel {name}: the provider remembers a key for {window:g} s, kirim may retry "
            f"up to {horizon:g} s after the first request ({config.max_attempts} attempts, "
            f"backoff up to {config.worker.backoff_max:g} s)"
        )
        if window >= horizon:
            checks.append(Check(f"dedup_window.{name}", OK, what))
        else:
            checks.append(
                Check(
                    f"dedup_window.{name}",
                    WARNING,
                    what + ": a late retry with the same key can be delivered twice",
                    "lower [worker] max_attempts or backoff_max until the horizon fits the "
                    "window, or use a provider that remembers keys longer",
                )
            )
    return checks


def _inbox(config: Config) -> Check:
    """An inbox channel's feed tokens: whether ``[inbox] secret`` is set (never shown)."""
    inboxes = sorted(n for n, c in config.channels.items() if c.provider == "inbox")
    if not inboxes:
        return Check("inbox", SKIPPED, "no channel of provider inbox (the in-app feed)")
    what = f"channel {', '.join(inboxes)} writes recipients' feeds"
    if config.inbox.secret is None:
        return Check(
            "inbox",
            WARNING,
            f"{what}, but no [inbox] secret is set: no feed token can be made, so a "
            "browser can read a feed only with an operator token",
            "set [inbox] secret (or KIRIM_INBOX_SECRET) to 32 random bytes in hex, and "
            "have your backend hand out feed tokens (docs/inbox.md)",
        )
    origins = ", ".join(config.inbox.allowed_origins) or "none (no browser page may call it)"
    return Check(
        "inbox", OK, f"{what}; feed tokens are signed (secret set); CORS origins: {origins}"
    )


def _span(seconds: float) -> str:
    """A duration as [retention] takes one: ``30d``, ``12h``, ``90m`` or ``45s``."""
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{math.ceil(seconds):g}s"


def _retention(config: Config) -> Check:
    """[retention] keep against the retry horizon and each channel's dedup window: a
    delivery's record (its attempts, the provider's message ids) should outlive both."""
    keep = config.worker.retention_keep
    if keep is None:
        return Check(
            "retention",
            SKIPPED,
            "no [retention] keep: every delivery is kept for ever (the ledger only grows)",
            'set keep = "90d" in a [retention] table (the worker then prunes), or run '
            "`kirim prune --keep 90d` now and then",
        )
    keys = config.worker.retention_keys
    what = f"finished deliveries are pruned {_span(keep)} after their last change"
    short = []
    horizon = retry_horizon(config)
    if keep < horizon:
        short.append(
            f"the retry horizon ({_span(horizon)}: {config.max_attempts} attempts, backoff up "
            f"to {config.worker.backoff_max:g} s): a failed delivery may be gone before an "
            "operator looks at it or retries it"
        )
    for name, channel in sorted(config.channels.items()):
        window = channel.dedup_window
        if window is not None and keep < window:
            short.append(
                f"channel {name}'s dedup window ({_span(window)}): its record goes while "
                "the provider still remembers its key, and may still report on it"
            )
    if not short:
        return Check("retention", OK, f"{what}, their keys kept {_span(keys)} more")
    longest = max([horizon] + [c.dedup_window or 0.0 for c in config.channels.values()])
    return Check(
        "retention",
        WARNING,
        f"{what}, which is shorter than " + "; and than ".join(short),
        f'set [retention] keep = "{_span(math.ceil(longest / 86_400) * 86_400.0)}" or more',
    )
