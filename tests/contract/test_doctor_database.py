"""`kirim doctor` names what the database keeps: its replication mode, a pooler in
front, the intents workers found missing, SQLite's synchronous setting."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest

from kirim.config import Config
from kirim.doctor.audit import Check
from kirim.doctor.checks import diagnose
from kirim.doctor.probes import Database
from kirim.store import open_store
from pg import ADMIN_URL, fresh_database
from pgbouncer import bouncer, pooled_url
from pgcluster import Replication, cluster


def checks(url: str, config: Config | None = None) -> dict[str, Check]:
    with Database(url) as db:
        return {c.name: c for c in diagnose(db, config or Config(database=url), now=0.0)}


async def migrated(url: str) -> str:
    store = open_store(url)
    await store.open()
    try:
        await store.migrate()
    finally:
        await store.close()
    return url


async def test_a_lone_server_reached_directly(request: pytest.FixtureRequest) -> None:
    """No standby, no pooler, no note: each says so, as ok."""
    url = await migrated(fresh_database(request))
    found = checks(url)
    assert found["replication"].status == "ok"
    assert "no standby streams" in found["replication"].message
    assert found["pooler"].status == "ok"
    assert "direct" in found["pooler"].message
    assert found["ledger_behind"].status == "ok"


async def test_a_pooler_in_front_and_listen_url(request: pytest.FixtureRequest) -> None:
    """Through PgBouncer the pooler check warns that LISTEN wakes no one and names
    listen_url; with listen_url pointing at the server itself it is ok."""
    direct = await migrated(fresh_database(request))
    pooler = bouncer(request, urlsplit(ADMIN_URL).port or 5432)
    url = pooled_url(direct, pooler)
    warned = checks(url)["pooler"]
    assert warned.status == "warning"
    assert "pooler or proxy" in warned.message
    assert "listen_url" in (warned.fix or "")
    fixed = checks(url, Config(database=url, listen_url=direct))["pooler"]
    assert fixed.status == "ok"
    assert "listen_url" in fixed.message


@pytest.mark.slow
@pytest.mark.parametrize(
    ("replication", "status", "words"),
    [
        ("sync", "ok", "synchronous replication"),
        ("async", "warning", "asynchronous replication"),
        ("async-off", "warning", "synchronous_commit=off"),
    ],
)
def test_the_replication_mode_is_named(
    request: pytest.FixtureRequest, replication: Replication, status: str, words: str
) -> None:
    """A primary with a synchronous standby is ok; an asynchronous one, or commits
    that return before they are flushed, warn that a committed intent can be lost."""
    made = cluster(request, replication)
    found = checks(made.primary.url())["replication"]
    assert (found.status, words in found.message) == (status, True), found


@pytest.mark.slow
def test_a_standby_is_a_problem(request: pytest.FixtureRequest) -> None:
    """Pointed at the standby, doctor says it takes no writes and names the fix."""
    made = cluster(request, "async")
    found = checks(made.standby.url())["replication"]
    assert found.status == "problem"
    assert "target_session_attrs=read-write" in (found.fix or "")


@pytest.mark.parametrize(("query", "status"), [("", "ok"), ("?synchronous=normal", "warning")])
async def test_sqlite_durability_follows_the_url(tmp_path: Path, query: str, status: str) -> None:
    """SQLite: synchronous=full (the default) keeps every commit through a power loss;
    normal warns that the last commits can be undone."""
    url = await migrated(f"sqlite:///{tmp_path / 'kirim.db'}{query}")
    assert checks(url)["durability"].status == status
