"""kirim behind PgBouncer in transaction pooling mode: one client connection's
consecutive transactions run on different server connections, and one server
connection serves many clients, so the store must keep nothing in a session."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from urllib.parse import urlsplit

import psycopg
import pytest
from structlog.testing import capture_logs
from test_postgres_isolation import isolation_in_force
from test_postgres_jit import jit_in_force

from kirim.channels import Channel
from kirim.config import Config
from kirim.doctor.probes import Database
from kirim.engine import Kirim
from kirim.keys import canonical_json, payload_hash
from kirim.model import DeliveryStatus, JobStatus, RecordFilter
from kirim.store.base import NewDelivery
from kirim.store.postgres import PostgresStore
from kirim.testing import FlakyProvider
from kirim.worker import WorkerSettings
from pg import ADMIN_URL, fresh_database
from pgbouncer import Bouncer, bouncer, pooled_url

StoreFactory = Callable[..., Awaitable[PostgresStore]]
REPEAT = 8  # more than psycopg's automatic prepare threshold (5 executions)
#: rounds of two clients alternating on one server connection (a round: about 2 ms)
ALTERNATIONS = 500


@pytest.fixture
def direct_url(request: pytest.FixtureRequest) -> str:
    """A fresh, empty database on the shared server."""
    return fresh_database(request)


@pytest.fixture
def one_server(request: pytest.FixtureRequest) -> Bouncer:
    """A PgBouncer with a single server connection per database: every client shares it."""
    return bouncer(request, urlsplit(ADMIN_URL).port or 5432, pool_size=1)


@pytest.fixture
async def make_store(direct_url: str, one_server: Bouncer) -> AsyncIterator[StoreFactory]:
    """Stores (each a process's pool of one connection) reaching the database through
    ``one_server``."""
    stores: list[PostgresStore] = []

    async def make() -> PostgresStore:
        store = PostgresStore(pooled_url(direct_url, one_server) + "?pool_max_size=1")
        await store.open()
        stores.append(store)
        return store

    yield make
    for store in stores:
        await store.close()


def reconnect(pooler: Bouncer) -> None:
    """Close the pooler's server connections (its admin console's RECONNECT): the next
    transaction of any client runs on a new one."""
    with psycopg.connect(pooler.url("pgbouncer"), autocommit=True) as admin:
        admin.execute("RECONNECT")


async def migrated_with_one(direct_url: str) -> int:
    """The database migrated and one delivery enqueued (its id), straight to it."""
    direct = PostgresStore(direct_url)
    await direct.open()
    try:
        await direct.migrate()
        return await enqueued(direct)
    finally:
        await direct.close()


async def enqueued(store: PostgresStore) -> int:
    """One delivery (its id), enqueued by a store straight to the database."""
    item = NewDelivery(
        idempotency_key="k-1",
        event_id="e-1",
        recipient="u-1",
        channel="push",
        payload_json=canonical_json({"i": 1}),
        payload_hash=payload_hash(canonical_json({"i": 1})),
        run_at=None,
        max_attempts=3,
    )
    [result] = await store.enqueue([item], now=1000.0)
    return result.delivery.id


async def test_clients_sharing_a_server_connection_never_collide(
    make_store: StoreFactory, direct_url: str
) -> None:
    """Two processes whose transactions alternate on one pooled server connection each
    repeat their own read, and both keep getting answers (no statement is prepared in
    one client's name on a connection another client uses)."""
    delivery_id = await migrated_with_one(direct_url)
    a, b = await make_store(), await make_store()
    for _ in range(REPEAT):
        job = await a.get_job(delivery_id)
        attempts = (await b.attempts_of_many([delivery_id]))[delivery_id]
        assert job is not None
        assert job.status is JobStatus.QUEUED
        assert attempts == []


async def test_a_statement_run_alone_leaves_no_server_connection_behind(
    make_store: StoreFactory, direct_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A statement run alone (a batch's intents or plain finish) with the JIT off and a
    read of another client alternate on the pooler's one server connection, and each
    gets its answer. Sent as a pipeline in autocommit, the pipeline's end (a Sync, then
    a Flush) could reach the pooler after it had handed the server connection back: the
    Flush took it (it has no answer, so PgBouncer never gave it back), and the other
    client waited for ever (this loop hung within its first few hundred rounds). Through
    a pooler the statement runs in a transaction of its own, with the JIT still off."""
    jit = jit_in_force(monkeypatch)
    delivery_id = await migrated_with_one(direct_url)
    a, b = await make_store(), await make_store()
    assert not a.driver.direct
    for _ in range(ALTERNATIONS):
        assert await asyncio.wait_for(a.driver.run_alone(jit()), 10) == "off"
        job = await asyncio.wait_for(b.get_job(delivery_id), 10)
        assert job is not None


async def test_through_a_pooler_every_unit_of_work_runs_at_read_committed(
    make_store: StoreFactory, direct_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database's sessions default to SERIALIZABLE (``ALTER DATABASE``: a URL's
    options do not pass a pooler). A write transaction and a statement run alone (in a
    transaction of its own here) run at READ COMMITTED, said in their ``BEGIN``, a read
    of several statements at REPEATABLE READ (one snapshot);
    nothing is left in the shared server session (a read of one statement there, with
    no ``BEGIN``, still sees the database's level)."""
    level = isolation_in_force(monkeypatch)
    await migrated_with_one(direct_url)
    name = urlsplit(direct_url).path.lstrip("/")
    async with await psycopg.AsyncConnection.connect(ADMIN_URL, autocommit=True) as admin:
        await admin.execute(
            f'ALTER DATABASE "{name}" SET default_transaction_isolation = serializable'
        )
    a = await make_store()
    assert not a.driver.direct
    for _ in range(REPEAT):
        assert await a.driver.run_alone(level()) == "read committed"
        assert await a.driver.run(level(), write=True) == "read committed"
        assert await a.driver.run(level(), write=False) == "repeatable read"  # one snapshot
        assert await a.driver.run(level(), write=False, snapshot=False) == "serializable"


async def test_a_read_never_runs_another_clients_statement(
    make_store: StoreFactory, direct_url: str, one_server: Bouncer
) -> None:
    """A process whose server connection was replaced (the pooler reconnected) and
    another one that has used the new one since: each read still runs its own query and
    returns its own kind of record."""
    delivery_id = await migrated_with_one(direct_url)
    a, b = await make_store(), await make_store()
    for _ in range(REPEAT):
        assert (await b.attempts_of_many([delivery_id]))[delivery_id] == []
    reconnect(one_server)
    for _ in range(REPEAT):
        job = await a.get_job(delivery_id)
        assert job is not None
        assert job.delivery_id == delivery_id
    # b's read, on the server connection where a's read has been used since
    assert (await b.attempts_of_many([delivery_id]))[delivery_id] == []


async def test_doctor_leaves_nothing_in_a_pooled_session(
    make_store: StoreFactory, direct_url: str, one_server: Bouncer
) -> None:
    """`kirim doctor`'s read-only connection through the pooler leaves the server
    connection it used as it found it: a worker's write on it afterwards goes through."""
    direct = PostgresStore(direct_url)
    await direct.open()
    try:
        await direct.migrate()
    finally:
        await direct.close()
    with Database(pooled_url(direct_url, one_server)) as db:
        assert db.named_scalar("doctor_dead_count") == 0
    store = await make_store()
    assert await enqueued(store) > 0


async def test_burst_workers_sharing_a_server_connection_deliver_everything(
    direct_url: str, one_server: Bouncer
) -> None:
    """Two burst workers, each a process with its own pool, whose transactions all run
    on one pooled server connection: every notification is delivered once, and no store
    call fails on the way."""
    direct = PostgresStore(direct_url)
    await direct.open()
    try:
        await direct.migrate()
    finally:
        await direct.close()
    provider = FlakyProvider(idempotent=False)
    url = pooled_url(direct_url, one_server) + "?pool_max_size=2"
    config = Config(database=url, max_attempts=3)
    settings = WorkerSettings(lease=30.0, concurrency=4, batch_size=4, poll_interval=0.05)
    apps = [Kirim(config, channels={"push": Channel(name="push", provider=provider)})]
    apps.append(Kirim(config, channels={"push": Channel(name="push", provider=provider)}))
    try:
        for app in apps:
            await app.open()
        keys = [
            (await apps[0].notify(f"e{i}", f"u{i}", "push", {"i": i})).idempotency_key
            for i in range(40)
        ]
        workers = [app.worker(settings=settings, worker_id=f"w{n}") for n, app in enumerate(apps)]
        with capture_logs() as logs:
            await asyncio.wait_for(asyncio.gather(*(w.run(burst=True) for w in workers)), 120)
        assert [e for e in logs if e["log_level"] == "error"] == []
        assert sorted(provider.per_key.values()) == [1] * len(keys)
        listed = await apps[0].store.records(RecordFilter(status=DeliveryStatus.SENT), limit=100)
        assert len(listed) == len(keys)
    finally:
        for app in apps:
            await app.close()


async def test_listen_url_wakes_a_worker_whose_database_goes_through_the_pooler(
    make_store: StoreFactory, direct_url: str, one_server: Bouncer
) -> None:
    """A store reached through the pooler, with listen_url pointing at the server:
    it says LISTEN is direct, and an enqueue through the pooler wakes its wait."""
    direct = PostgresStore(direct_url)
    await direct.open()
    try:
        await direct.migrate()
    finally:
        await direct.close()
    url = pooled_url(direct_url, one_server)
    listening = PostgresStore(url, listen_url=direct_url)
    await listening.open()
    try:
        assert listening.wakeups.database is not None
        assert listening.wakeups.database.in_front is True
        assert not listening.wakeups.pooled
        assert await listening.wait_for_jobs(0) is True  # LISTEN: the first wait polls
        await enqueued(await make_store())
        assert await listening.wait_for_jobs(30) is True
    finally:
        await listening.close()


async def test_a_listen_url_that_does_not_answer_fails_no_command(direct_url: str) -> None:
    """Only workers LISTEN: a store whose listen_url is unreachable still opens (its
    route unknown), so `kirim send` on an app host is not refused for it."""
    store = PostgresStore(
        direct_url, listen_url="postgresql://postgres@127.0.0.1:1/x?connect_timeout=1"
    )
    await store.open()
    try:
        assert store.wakeups.via == "listen_url"
        assert store.wakeups.listen is None
        assert store.wakeups.warning() is None
    finally:
        await store.close()
