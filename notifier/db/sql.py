"""What every module of ``notifier.db`` shares: one parameter style, and array literals.

Every statement is written with SQLAlchemy's named parameters (``:name``). One that runs on the
driver's own cursor (a claim read without a result layer between, COPY, a producer's psycopg
connection) is converted once, when its module is imported, by ``for_driver``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

_NAMED = re.compile(r"(?<![:\w]):(\w+)")


def for_driver(sql: str) -> str:
    """``sql`` with each ``:name`` parameter spelled ``%(name)s``, as psycopg's cursors take
    them (and each ``%`` doubled)."""
    return _NAMED.sub(r"%(\1)s", sql.replace("%", "%%"))


#: How far from now a time counts as it is where a read computes an age: PostgreSQL holds times
#: from 4713 BC to 294276 AD and ``±infinity``, and cannot subtract infinite ones. Beyond this,
#: a time is taken as this far away, so an age is always a large finite number.
AGE_BOUND = "interval '100 years'"


def seconds_since(at: str) -> str:
    """SQL for the seconds from the timestamptz ``at`` (a column or aggregate written in the
    query, never a value) until now, as float8; within ``AGE_BOUND`` either way, never an error.
    ``NULL`` if ``at`` is."""
    # least and greatest skip a NULL: without the CASE, no time at all would read as a century
    clamped = f"greatest(least({at}, now() + {AGE_BOUND}), now() - {AGE_BOUND})"
    return f"CASE WHEN {at} IS NOT NULL THEN extract(epoch FROM now() - {clamped})::float8 END"


def like_escape(value: str) -> str:
    """``value`` as a literal piece of a ``LIKE``/``ILIKE`` pattern written with
    ``ESCAPE '\\'``: ``%``, ``_`` and the backslash match themselves."""
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def parameters(sql: str) -> set[str]:
    """The names of ``sql``'s ``:name`` parameters."""
    return set(_NAMED.findall(sql))


def rowcount(result: Any) -> int:
    """How many rows a statement changed."""
    return int(result.rowcount)


def number_array(values: Iterable[float | None]) -> str:
    """A numeric array as one literal for ``CAST(... AS bigint[])`` and the like: psycopg dumps
    a list element by element, which every batch would pay for each of its rows."""
    return "{" + ",".join("NULL" if v is None else repr(v) for v in values) + "}"


def text_array(values: Iterable[str | None]) -> str:
    """A text array as one literal, for ``CAST(... AS text[])``, as ``number_array`` for
    numbers: each element double-quoted with its backslashes and double quotes escaped, which
    the array parser reads back exactly, whatever else the text holds."""
    return "{" + ",".join("NULL" if v is None else _quoted(v) for v in values) + "}"


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def columns(rows: Iterable[tuple[str, ...]], width: int) -> list[list[str]]:
    """Distinct tuples turned into ``width`` parallel arrays, as ``unnest`` takes them."""
    columns: list[list[str]] = [[] for _ in range(width)]
    for row in dict.fromkeys(rows):
        for column, value in zip(columns, row, strict=True):
            column.append(value)
    return columns
