"""POST /v1/notifications throughput against `kirim serve` (one uvicorn worker, SQLite).

Starts `kirim serve` on 127.0.0.1 on a scratch SQLite file, creates a token, then
sends new notifications (each with its own Idempotency-Key) from httpx async
clients in ``--clients`` processes with ``--connections`` requests in flight each
(httpx's pool slows down with many connections, so the load is spread over a few
processes), for a bounded count and time. Prints accepted notifications per second,
latency percentiles and the server's CPU time per request; asserts nothing.
Loopback only.

    python bench/http_bench.py [--requests 20000] [--clients 4] [--connections 6]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

KIRIM = [sys.executable, "-m", "kirim"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def kirim(folder: Path, *args: str) -> str:
    done = subprocess.run(
        [*KIRIM, "--config", str(folder / "kirim.toml"), *args],
        capture_output=True,
        text=True,
        check=True,
        cwd=folder,
    )
    return done.stdout


async def wait_ready(base: str, deadline: float) -> None:
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            try:
                if (await client.get(f"{base}/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError("kirim serve did not become ready")


async def _load(
    base: str, token: str, indexes: range, connections: int, stop_at: float
) -> tuple[list[float], dict[int, int], float]:
    """One load-generator process: ``connections`` requests in flight at a time.

    It sends through httpx's async transport (the client's own per-request work,
    cookies, auth and redirects, would cost more CPU than the server spends).
    """
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    counter = iter(indexes)
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    url = httpx.URL(f"{base}/v1/notifications")
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    async with httpx.AsyncHTTPTransport(limits=limits) as transport:

        async def one_connection() -> None:
            for i in counter:
                if time.monotonic() > stop_at:
                    return
                body = {
                    "event_id": f"order-{i}",
                    "recipient": f"user-{i % 997}",
                    "channel": "push",
                    "payload": {"title": "Your order shipped", "n": i},
                }
                request = httpx.Request(
                    "POST",
                    url,
                    content=json.dumps(body).encode(),
                    headers={**headers, "Idempotency-Key": f"bench-{i}"},
                )
                started = time.perf_counter()
                try:
                    response = await transport.handle_async_request(request)
                    await response.aread()
                    await response.aclose()
                except httpx.TransportError:
                    statuses[0] = statuses.get(0, 0) + 1  # 0: no answer
                    return
                latencies.append(time.perf_counter() - started)
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

        started = time.perf_counter()
        await asyncio.gather(*(one_connection() for _ in range(connections)))
        return latencies, statuses, time.perf_counter() - started


def _client_process(
    args: tuple[str, str, range, int, float, Any],
) -> tuple[list[float], dict[int, int], float, float, float]:
    base, token, indexes, connections, seconds, go = args
    go.wait()  # every process starts together
    began, cpu = time.time(), time.process_time()
    run: Any = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop

        run = uvloop.run
    latencies, statuses, _ = run(
        _load(base, token, indexes, connections, time.monotonic() + seconds)
    )
    return latencies, statuses, began, time.time(), time.process_time() - cpu


def load(
    base: str, token: str, total: int, clients: int, connections: int, seconds: float
) -> dict[str, Any]:
    """``clients`` processes of ``connections`` each; ``total`` requests at most."""
    share = -(-total // clients)
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        go = manager.Event()
        jobs = [
            (base, token, range(k * share, min(total, (k + 1) * share)), connections, seconds, go)
            for k in range(clients)
        ]
        with ctx.Pool(clients) as pool:
            pending = pool.map_async(_client_process, jobs)
            time.sleep(1.0)  # let them import and connect
            go.set()
            found = pending.get(timeout=seconds + 120)
    latencies = sorted(x for lat, *_ in found for x in lat)
    statuses: dict[int, int] = {}
    for _, st, *_ in found:
        for code, n in st.items():
            statuses[code] = statuses.get(code, 0) + n
    if not latencies:
        return {"requests": 0, "statuses": {str(k): v for k, v in statuses.items()}}
    elapsed = max(f[3] for f in found) - min(f[2] for f in found)
    client_cpu = sum(f[4] for f in found)
    accepted = statuses.get(201, 0)

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000

    return {
        "requests": len(latencies),
        "accepted": accepted,
        "other_statuses": {str(k): v for k, v in statuses.items() if k != 201},
        "seconds": round(elapsed, 2),
        "accepted_per_s": round(accepted / elapsed, 1),
        "p50_ms": round(pct(0.50), 2),
        "p99_ms": round(pct(0.99), 2),
        "max_ms": round(latencies[-1] * 1000, 2),
        "mean_ms": round(statistics.fmean(latencies) * 1000, 2),
        "client_cpu_ms_per_request": round(client_cpu * 1000 / max(1, len(latencies)), 3),
    }


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--clients", type=int, default=4, help="Load-generator processes.")
    parser.add_argument(
        "--connections", type=int, default=6, help="Requests in flight per process."
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="Stop sending after this.")
    parser.add_argument(
        "--synchronous",
        choices=["full", "normal"],
        default="full",
        help="SQLite's synchronous setting (full: fsync every commit).",
    )
    parser.add_argument(
        "--log-level",
        choices=["warning", "info"],
        default="warning",
        help="The server's log level (info: a line per request, to /dev/null).",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kirim-http-bench-") as tmp:
        folder = Path(tmp)
        (folder / "kirim.toml").write_text(
            f'database = "sqlite:///{folder / "bench.db"}?synchronous={args.synchronous}"\n'
            '[channels.push]\nprovider = "webhook"\nurl = "http://127.0.0.1:9/push"\n'
        )
        kirim(folder, "init")
        token = kirim(folder, "token", "create", "--name", "bench").strip().splitlines()[-1]
        port = free_port()
        log = (folder / "serve.log").open("w")
        server = subprocess.Popen(
            [
                *KIRIM,
                "--config",
                str(folder / "kirim.toml"),
                "--log-level",
                args.log_level,
                "serve",
                "--port",
                str(port),
            ],
            cwd=folder,
            stdout=subprocess.DEVNULL,
            stderr=log,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        base = f"http://127.0.0.1:{port}"
        try:
            asyncio.run(wait_ready(base, time.monotonic() + 30))
            cpu_before = cpu_seconds(server.pid)
            result = load(base, token, args.requests, args.clients, args.connections, args.seconds)
            server_cpu = cpu_seconds(server.pid) - cpu_before
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            log.close()
            if server.returncode != 0:
                print((folder / "serve.log").read_text()[-2000:], file=sys.stderr)
        result = {
            "bench": "http POST /v1/notifications",
            "database": f"sqlite (synchronous={args.synchronous})",
            "log_level": args.log_level,
            "clients": args.clients,
            "connections_per_client": args.connections,
            **result,
            "server_cpu_ms_per_request": round(server_cpu * 1000 / max(1, result["requests"]), 3),
        }
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
