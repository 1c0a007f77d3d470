"""A throw-away PostgreSQL database for a benchmark: ``fresh_postgres(url, name)`` drops
and makes ``name`` on ``url``'s server and returns its URL."""

from __future__ import annotations


async def fresh_postgres(url: str, name: str) -> str:
    """A new database ``name`` beside ``url``'s, dropped and made again."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(f"DROP DATABASE IF EXISTS {name}")
        await conn.execute(f"CREATE DATABASE {name}")
    return url.rsplit("/", 1)[0] + "/" + name
