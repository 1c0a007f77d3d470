"""Where PostgreSQL's WAL per delivery goes: by record type, by table and index.

``python bench/wal_breakdown.py --database postgresql://… [--notifications 5000]
[--workers 1] [--checkpoint] [--json]`` runs what ``kirim bench`` runs (enqueue, then
deliver with worker processes to a zero-latency provider) on a throw-away database
(created, then dropped), and reads back with ``pg_walinspect`` (PostgreSQL 15+; the
extension is created in the throw-away database) the WAL written between the
server's WAL position before the workers start and after they end: the enqueue is
left out.

It prints, per delivery: the bytes between the two positions (what ``kirim bench``
reports as ``wal_bytes_per_delivery``); the records by resource manager and record
type (``pg_get_wal_stats``: records, their bytes without full-page images, the
full-page images' bytes); and the records by relation: each record is put on the
relation of its first block reference (``rel spc/db/relfilenode``, matched with
``pg_relation_filenode`` of the database's ``pg_class`` after the run), named as a
table or an index of it. Records of other
databases (a shared server) are counted apart, by the database of their block
reference; records with no block reference (commits, running-xacts snapshots) cannot
be told apart, and are counted as this database's (``own_record_bytes_per_delivery``:
the records of this database and those of no relation, without FPI, the figure to
compare between runs on a shared server).

Full-page images (FPI) are counted apart everywhere: the first change of a page after
a checkpoint logs the whole page, so they depend on when the server checkpoints, not
on kirim. ``--checkpoint`` issues a CHECKPOINT before the workers start, so that
every page the run touches is logged whole once (the worst case); without it the
enqueue has just written most pages, and a run with no checkpoint inside it logs
few. The gap between the positions' difference and the records' sum is WAL page
headers and each record's alignment to 8 bytes. A temporary physical replication
slot, held by a session on the URL's database while the script runs, keeps the
server from recycling the run's WAL before it is read (a checkpoint in the run
would); it is gone when the session ends (the user needs the REPLICATION attribute
or to be a superuser, and the server a free ``max_replication_slots``).

Nothing is asserted: it prints (``--json``: one JSON object instead).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from kirim.devtools import bench, pgfigures

BLOCK = re.compile(r"blkref #\d+: rel (\d+)/(\d+)/(\d+)")


def _conn(url: str) -> Any:
    import psycopg

    from kirim.store.postgres import postgres_conninfo

    conninfo, _ = postgres_conninfo(url)
    return psycopg.connect(conninfo, autocommit=True, connect_timeout=10)


def _lsn(url: str) -> str:
    """The server's WAL position, flushed: pg_walinspect reads no further than the flush.

    The position written can be ahead of the flush (a background writer's records, a
    commit without ``synchronous_commit``); a transaction of our own that writes its
    commit record flushes the WAL up to it, past the position taken before it.
    """
    with _conn(url) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        conn.execute("SET synchronous_commit = on")
        conn.execute("SELECT pg_current_xact_id()")
    return str(row[0])


def _relations(conn: Any) -> dict[int, str]:
    """relfilenode → ``table`` or ``table.index`` (and ``table (toast)``) of this database."""
    rows = conn.execute(
        """
        SELECT pg_relation_filenode(c.oid), c.relname, c.relkind,
               coalesce(t.relname, tt.relname)
        FROM pg_class c
        LEFT JOIN pg_index i ON i.indexrelid = c.oid
        LEFT JOIN pg_class t ON t.oid = i.indrelid
        LEFT JOIN pg_class tt ON tt.reltoastrelid = c.oid
        WHERE pg_relation_filenode(c.oid) IS NOT NULL
        """
    ).fetchall()
    names: dict[int, str] = {}
    for node, name, kind, owner in rows:
        if kind == "i" and owner:
            names[int(node)] = f"{owner}.{name}"
        elif kind == "t" and owner:
            names[int(node)] = f"{owner} (toast)"
        else:
            names[int(node)] = str(name)
    return names


def breakdown(url: str, start: str, end: str, delivered: int) -> dict[str, Any]:
    """The WAL between ``start`` and ``end`` (LSNs), per delivery, by record type and by
    relation (``url``: the throw-away database, where ``pg_walinspect`` is)."""
    per = float(delivered or 1)
    with _conn(url) as conn:
        db_oid = int(
            conn.execute(
                "SELECT oid FROM pg_database WHERE datname = current_database()"
            ).fetchone()[0]
        )
        total = int(conn.execute("SELECT pg_wal_lsn_diff(%s, %s)", [end, start]).fetchone()[0])
        names = _relations(conn)
        stats = conn.execute(
            'SELECT "resource_manager/record_type", count, record_size, fpi_size'
            " FROM pg_get_wal_stats(%s, %s, true) WHERE count > 0"
            " ORDER BY combined_size DESC",
            [start, end],
        ).fetchall()
        records = conn.execute(
            "SELECT resource_manager, record_type, record_length, fpi_length, block_ref"
            " FROM pg_get_wal_records_info(%s, %s)",
            [start, end],
        ).fetchall()
    by_type = [
        {
            "record": str(name),
            "records": round(int(n) / per, 2),
            "bytes": round(int(size) / per, 1),
            "fpi_bytes": round(int(fpi) / per, 1),
        }
        for name, n, size, fpi in stats
    ]
    rel: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    summed = 0
    for rmgr, rtype, length, fpi, block_ref in records:
        summed += int(length)
        found = BLOCK.search(block_ref or "")
        if found is None:
            where = "(no relation)"
        elif int(found.group(2)) not in (db_oid, 0):
            where = "(other databases)"
        else:
            node = int(found.group(3))
            where = names.get(node, f"(relfilenode {node})")
        cell = rel[(where, f"{rmgr}/{rtype}")]
        cell[0] += 1
        cell[1] += int(length) - int(fpi or 0)
        cell[2] += int(fpi or 0)
    by_relation = [
        {
            "relation": where,
            "record": record,
            "records": round(n / per, 2),
            "bytes": round(size / per, 1),
            "fpi_bytes": round(fpi / per, 1),
        }
        for (where, record), (n, size, fpi) in sorted(
            rel.items(), key=lambda kv: -(kv[1][1] + kv[1][2])
        )
    ]
    tables: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for row in by_relation:
        table = str(row["relation"]).split(".")[0].removesuffix(" (toast)")
        tables[table][0] += float(row["bytes"])
        tables[table][1] += float(row["fpi_bytes"])
    own = {t: cell for t, cell in tables.items() if t != "(other databases)"}
    return {
        "wal_bytes_per_delivery": round(total / per, 1),
        # this database's records (and those of no relation: commits), without FPI: the
        # figure to compare between runs on a shared server
        "own_record_bytes_per_delivery": round(sum(b for b, _ in own.values()), 1),
        "own_fpi_bytes_per_delivery": round(sum(f for _, f in own.values()), 1),
        "record_bytes_per_delivery": round(summed / per, 1),
        "fpi_bytes_per_delivery": round(sum(float(r["fpi_bytes"]) for r in by_type), 1),
        "headers_and_alignment_per_delivery": round((total - summed) / per, 1),
        "by_table": {
            t: {"bytes": round(b, 1), "fpi_bytes": round(f, 1)}
            for t, (b, f) in sorted(tables.items(), key=lambda kv: -kv[1][0])
        },
        "by_record_type": by_type,
        "by_relation": by_relation,
    }


def measure(database: str, notifications: int, workers: int, checkpoint: bool) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="kirim-wal-") as tmp,
        bench.scratch(database, Path(tmp)) as url,
        _conn(database) as keeper,
    ):
        # the server keeps the run's WAL until it is read: a temporary physical slot,
        # held by a session on the URL's own database (not the throw-away one, which
        # the counters' snapshot waits to have to itself)
        keeper.execute(
            "SELECT pg_create_physical_replication_slot(%s, true, true)",
            [f"kirim_wal_{Path(tmp).name[-8:].lower().replace('-', '_')}"],
        )
        with _conn(url) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        asyncio.run(bench._enqueue(url, notifications, 0))
        before = pgfigures.snapshot(url)
        if checkpoint:
            with _conn(url) as conn:
                conn.execute("CHECKPOINT")
        start = _lsn(url)
        seconds, sent, _ = bench._deliver(url, workers)
        end = _lsn(url)
        after = pgfigures.snapshot(url)
        out = {
            "notifications": notifications,
            "workers": workers,
            "checkpoint_before": checkpoint,
            "delivered": sent,
            "deliveries_per_s": round(sent / seconds, 1) if seconds > 0 else None,
            **breakdown(url, start, end, sent),
        }
        hot = pgfigures.figures(before, after, sent)
        out["hot"] = {k: v for k, v in hot.items() if k.startswith(("hot_", "updates_"))}
        return out


def show(result: dict[str, Any], top: int) -> None:
    print(
        f"{result['delivered']:,} delivered by {result['workers']} worker(s), "
        f"{result['deliveries_per_s']}/s; checkpoint before: {result['checkpoint_before']}"
    )
    print(
        f"WAL bytes per delivery: {result['wal_bytes_per_delivery']:,} "
        f"(records {result['record_bytes_per_delivery']:,}, of which FPI "
        f"{result['fpi_bytes_per_delivery']:,}; page headers and alignment "
        f"{result['headers_and_alignment_per_delivery']:,})"
    )
    print(
        f"this database's records (and commits), without FPI: "
        f"{result['own_record_bytes_per_delivery']:,}; their FPI: "
        f"{result['own_fpi_bytes_per_delivery']:,}"
    )
    print("\nby table (records without FPI, FPI), bytes per delivery:")
    for table, cell in result["by_table"].items():
        print(f"  {table:<40} {cell['bytes']:>8.1f} {cell['fpi_bytes']:>8.1f}")
    print("\nby record type: records, bytes, FPI bytes per delivery:")
    for row in result["by_record_type"]:
        cells = f"{row['records']:>6.2f} {row['bytes']:>8.1f} {row['fpi_bytes']:>8.1f}"
        print(f"  {row['record']:<32} {cells}")
    print(f"\nby relation and record (top {top}): records, bytes, FPI bytes per delivery:")
    for row in result["by_relation"][:top]:
        name = f"{row['relation']}  {row['record']}"
        print(f"  {name:<64} {row['records']:>6.2f} {row['bytes']:>8.1f} {row['fpi_bytes']:>8.1f}")
    print("\nupdates per delivery and HOT share:")
    for key, value in result["hot"].items():
        print(f"  {key:<44} {value}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", required=True, help="postgresql:// URL of a server")
    parser.add_argument("--notifications", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--checkpoint", action="store_true", help="CHECKPOINT before the run")
    parser.add_argument("--top", type=int, default=30, help="rows of the by-relation table")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(args.database, args.notifications, args.workers, args.checkpoint)
    if args.json:
        print(json.dumps(result))
    else:
        show(result, args.top)


if __name__ == "__main__":
    main()
