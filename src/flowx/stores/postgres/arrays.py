"""Array parameters of the batched hot-path statements, written in one pass by FlowX.

The batched step commit, start, lease release, suspend and signal delivery (``commit.py``,
``creates.py``, ``leases.py``, ``suspends.py``, ``signals.py``) send every column as one array
(``%(name)b``). psycopg's generic list dumper first scans each list for an element to choose a
dumper by, then writes element by element through that dumper: in a cProfile of B7 at 64 in
flight, that was about a tenth of the engine's client CPU. These lists say their element type
instead (``Texts``, ``Ints`` ...), and each is written straight into PostgreSQL's binary array
format (what ``array_recv`` reads): the same values, ``NULL`` elements and empty arrays
included. A plain ``list`` still goes through psycopg as before; the types are registered on
psycopg's global adapters, so every connection (FlowX's or a benchmark's) writes them alike.
"""

from __future__ import annotations

import struct
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format


class Texts(list[str | None]):
    """A ``text[]`` parameter."""


class Ints(list[int | None]):
    """An ``int4[]`` parameter."""


class BigInts(list[int | None]):
    """An ``int8[]`` parameter."""


class Bools(list[bool | None]):
    """A ``bool[]`` parameter."""


class Times(list[datetime | None]):
    """A ``timestamptz[]`` parameter (timezone-aware values only, as everywhere in FlowX)."""


# One dimension: ndim, whether any element is NULL, the element type, its length, its lower
# bound. An empty array has no dimension at all.
_HEAD = struct.Struct(">iiIii")
_EMPTY = struct.Struct(">iiI")
_SIZE = struct.Struct(">i")
_INT4 = struct.Struct(">ii")
_INT8 = struct.Struct(">iq")
_NULL = b"\xff\xff\xff\xff"
_TRUE = b"\x00\x00\x00\x01\x01"
_FALSE = b"\x00\x00\x00\x01\x00"
# timestamptz travels as microseconds since 2000-01-01 UTC.
_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)

_TEXT, _INT4_OID, _INT8_OID, _BOOL, _TIMESTAMPTZ = 25, 23, 20, 16, 1184


def _array(oid: int, values: list[Any], items: list[bytes], nulls: bool) -> bytes:
    if not values:
        return _EMPTY.pack(0, 0, oid)
    return _HEAD.pack(1, int(nulls), oid, len(values), 1) + b"".join(items)


class _ArrayDumper(Dumper):
    format = Format.BINARY


class _TextsDumper(_ArrayDumper):
    oid = 1009

    def __init__(self, cls: type, context: Any = None) -> None:
        super().__init__(cls, context)
        # Text goes in the connection's client encoding, as psycopg's own text dumper sends
        # it (UTF-8 for SQL_ASCII); a value that encoding cannot hold raises
        # ``UnicodeEncodeError`` before anything is sent, as there (``batching.isolatable``).
        info = self.connection.info if self.connection is not None else None
        encoding = info.encoding if info is not None else "utf-8"
        self._encoding = "utf-8" if encoding == "ascii" else encoding  # SQL_ASCII, as there

    def dump(self, obj: Any) -> bytes:
        encoding, size = self._encoding, _SIZE.pack
        nulls = None in obj
        if nulls and obj.count(None) == len(obj):
            items = [_NULL] * len(obj)  # a column no write in the batch sets
        else:
            items = [
                _NULL if v is None else size(len(data := v.encode(encoding))) + data for v in obj
            ]
        return _array(_TEXT, obj, items, nulls)


class _IntsDumper(_ArrayDumper):
    oid = 1007
    _element, _oid = _INT4, _INT4_OID

    def dump(self, obj: Any) -> bytes:
        pack, width = self._element.pack, self._element.size - 4
        try:
            items = [_NULL if v is None else pack(width, v) for v in obj]
        except struct.error as exc:
            # Refused as the server refuses a value out of its column's range: one write's
            # data, so a batch holding it is retried write by write (``batching.isolatable``).
            raise psycopg.DataError(
                f"an array element that is not a {width * 8}-bit integer: {exc}"
            ) from exc
        return _array(self._oid, obj, items, None in obj)


class _BigIntsDumper(_IntsDumper):
    oid = 1016
    _element, _oid = _INT8, _INT8_OID


class _BoolsDumper(_ArrayDumper):
    oid = 1000

    def dump(self, obj: Any) -> bytes:
        items = [_NULL if v is None else _TRUE if v else _FALSE for v in obj]
        return _array(_BOOL, obj, items, None in obj)


class _TimesDumper(_ArrayDumper):
    oid = 1185

    def dump(self, obj: Any) -> bytes:
        items: list[bytes] = []
        nulls = False
        for value in obj:
            if value is None:
                items.append(_NULL)
                nulls = True
            elif value.tzinfo is None:  # one write's data: its batch is retried write by write
                raise psycopg.DataError(
                    f"naive datetime {value!r}: FlowX stores timezone-aware times"
                )
            else:
                items.append(_INT8.pack(8, (value - _EPOCH) // _MICROSECOND))
        return _array(_TIMESTAMPTZ, obj, items, nulls)


for _kind, _dumper in (
    (Texts, _TextsDumper),
    (Ints, _IntsDumper),
    (BigInts, _BigIntsDumper),
    (Bools, _BoolsDumper),
    (Times, _TimesDumper),
):
    psycopg.adapters.register_dumper(_kind, _dumper)
