"""The schema version a database has, judged against the one this code needs."""

from __future__ import annotations

from kirim.errors import SchemaError
from kirim.store.base import SCHEMA_VERSION


def too_new(version: int) -> str:
    return (
        f"the database has schema version {version} but this kirim knows only up to "
        f"{SCHEMA_VERSION}; upgrade kirim"
    )


def check_version(url: str, version: int) -> None:
    """Raise SchemaError unless ``version`` is exactly the one this code needs."""
    if version == 0:
        raise SchemaError(f"{url} has no kirim schema; run `kirim init` first")
    if version > SCHEMA_VERSION:
        raise SchemaError(too_new(version))
    if version < SCHEMA_VERSION:
        raise SchemaError(
            f"{url} has schema version {version}, this kirim needs {SCHEMA_VERSION}; "
            "run `kirim init` to migrate"
        )
