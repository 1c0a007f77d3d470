"""The schema version a database has, judged against the one this code needs."""

from __future__ import annotations

from kirim.errors import SchemaError
from kirim.store.base import SCHEMA_VERSION
from kirim.validation import shown
from kirim.version import __version__


def parse_version(value: object) -> int:
    """The schema version ``kirim_meta`` holds, as an int; SchemaError if it is not one
    (not digits, or absurdly many): the database is damaged, or not kirim's."""
    text = str(value).strip()
    if text.isascii() and text.isdigit() and len(text) <= 9:
        return int(text)
    raise SchemaError(
        f"the schema version in kirim_meta is {shown(value)}, not a version number: "
        "the database is damaged or was not made by kirim"
    )


def too_new(version: int) -> str:
    """Why a kirim refuses a database that a newer kirim migrated."""
    return (
        f"the database has schema version {version} but this kirim ({__version__}) knows "
        f"only up to {SCHEMA_VERSION}: a newer kirim migrated it, and this one refuses to "
        "read or write it; upgrade kirim here (docs/upgrading.md)"
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
            "run `kirim migrate` (or `kirim init`) to migrate: docs/upgrading.md"
        )
