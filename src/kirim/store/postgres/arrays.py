"""The batch columns (Python lists) dumped for PostgreSQL in a few C calls, not per element.

A step's items go to the server as one array per column (``driver.bind``). psycopg's
own list dumper packs an array element by element in Python (a dump, a length and
two list appends each: about a tenth of a worker's CPU per delivery). The columns
kirim sends are flat lists of one type, so this dumper makes the same bytes as
psycopg's with a handful of C calls per list:

- integers, floats and booleans without NULLs: one ``struct.pack`` of the whole array;
- strings without NULLs: the encoded strings and their packed lengths, joined once;
- a list of NULLs only (a column no item of the batch has, say ``error`` in a batch of
  successes): its text literal ``{NULL,...}``, as psycopg sends it (type unknown, the
  query's cast names it).

Anything else (nested lists, NULLs among values, other element types, another client
encoding) is psycopg's own dumper's, unchanged. ``tests/unit/test_pg_arrays.py`` checks
the bytes against psycopg's.
"""

from __future__ import annotations

import struct
from typing import Any

from psycopg import postgres
from psycopg.abc import Buffer
from psycopg.adapt import PyFormat
from psycopg.types.array import BaseListDumper, ListBinaryDumper
from psycopg.types.array import ListDumper as ListTextDumper

__all__ = ["FlatListBinaryDumper"]

NoneType = type(None)

#: element oid -> (struct code, size) of the fixed-size types packed in one call
_FIXED: dict[int, tuple[str, int]] = {
    postgres.types["int2"].oid: ("h", 2),
    postgres.types["int4"].oid: ("i", 4),
    postgres.types["int8"].oid: ("q", 8),
    postgres.types["float8"].oid: ("d", 8),
    postgres.types["bool"].oid: ("?", 1),
}
_TEXT_OIDS = frozenset({postgres.types["text"].oid, postgres.types["varchar"].oid})
#: a one-dimensional binary array's header: ndim, has-null, element oid, length, lower bound
_HEAD = struct.Struct("!iiIii")
_LENGTH = struct.Struct("!i").pack
#: the packed length of every string shorter than this, made once (a list look-up is
#: several times cheaper than a ``pack`` call)
_SHORT = 4096
_LENGTHS = [_LENGTH(size) for size in range(_SHORT)]
_UTF8 = frozenset({"utf-8", "utf8"})


class FlatNullsDumper(ListTextDumper):
    """A list of NULLs only (or an empty list), as psycopg's text dumper writes it."""

    def dump(self, obj: list[Any]) -> Buffer | None:
        if obj and obj.count(None) == len(obj):
            return b"{" + b",".join([b"NULL"] * len(obj)) + b"}"
        return super().dump(obj)


class FlatListBinaryDumper(ListBinaryDumper):
    """psycopg's binary list dumper, with flat lists of one type packed at once."""

    def upgrade(self, obj: list[Any], format: PyFormat) -> BaseListDumper:
        dumper = super().upgrade(obj, format)
        if type(dumper) is ListTextDumper:  # NULLs only, or empty
            return FlatNullsDumper(self.cls, self._tx)
        return dumper

    def dump(self, obj: list[Any]) -> Buffer | None:
        sub = self.sub_dumper
        if not obj or sub is None:
            return super().dump(obj)
        kinds = set(map(type, obj))
        if NoneType in kinds or list in kinds:
            return super().dump(obj)
        oid, n = sub.oid, len(obj)
        fixed = _FIXED.get(oid)
        if fixed is not None:
            code, size = fixed
            args: list[Any] = [size] * (2 * n)
            args[1::2] = obj
            return struct.pack("!iiIii" + ("i" + code) * n, 1, 0, oid, n, 1, *args)
        if oid in _TEXT_OIDS and kinds == {str} and self._utf8():
            encoded = list(map(str.encode, obj))
            sizes = list(map(len, encoded))
            parts: list[bytes] = [_HEAD.pack(1, 0, oid, n, 1)] * (2 * n + 1)
            short = max(sizes) < _SHORT
            parts[1::2] = map(_LENGTHS.__getitem__ if short else _LENGTH, sizes)
            parts[2::2] = encoded
            return b"".join(parts)
        return super().dump(obj)

    def _utf8(self) -> bool:
        conn = self._tx.connection
        return conn is None or conn.info.encoding.lower() in _UTF8
