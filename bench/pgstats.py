"""The shared buffers a piece of work touched, table by table and index by index, from
PostgreSQL's own counters (``pg_statio_user_tables`` and ``pg_statio_user_indexes``): where
a drain on a big table spends what it spends more than on a small one.

A partition's table and indexes count as their partitioned table's and index's. A backend
hands its counters over when its transaction ends, at most once a second, and when it exits:
read them after the processes that did the work have exited.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.common import Conn

# (table, part, hits, reads): part is 'heap' or an index's name.
TOUCHED = """
    SELECT coalesce(pg_partition_root(relid), relid)::regclass::text, 'heap',
           sum(heap_blks_hit)::bigint, sum(heap_blks_read)::bigint
      FROM pg_statio_user_tables
     WHERE coalesce(pg_partition_root(relid), relid) = ANY(%(tables)s::regclass[])
     GROUP BY 1
    UNION ALL
    SELECT coalesce(pg_partition_root(relid), relid)::regclass::text,
           coalesce(pg_partition_root(indexrelid), indexrelid)::regclass::text,
           sum(idx_blks_hit)::bigint, sum(idx_blks_read)::bigint
      FROM pg_statio_user_indexes
     WHERE coalesce(pg_partition_root(relid), relid) = ANY(%(tables)s::regclass[])
     GROUP BY 1, 2
"""


@dataclass(frozen=True)
class Touched:
    """Buffers hit and read (not found in shared buffers) by (table, heap or index)."""

    counts: dict[tuple[str, str], tuple[int, int]]

    def minus(self, before: Touched) -> Touched:
        zero = (0, 0)
        return Touched(
            {
                key: (hit - before.counts.get(key, zero)[0], read - before.counts.get(key, zero)[1])
                for key, (hit, read) in self.counts.items()
            }
        )

    def per_row(self, rows: int, *, least: float = 0.05) -> str:
        """Buffers a row for each part that touched at least ``least`` a row, most first:
        ``notifications heap 6.1 (0.3 read)``."""
        parts = sorted(self.counts.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))
        said = []
        for (table, part), (hit, read) in parts:
            touched = (hit + read) / max(rows, 1)
            if touched < least:
                continue
            name = f"{table} heap" if part == "heap" else part
            said.append(f"{name} {touched:.1f} ({read / max(rows, 1):.1f} read)")
        return ", ".join(said) or "none"


def touched(conn: Conn, tables: Sequence[str]) -> Touched:
    """The counters now. The connection must not be in a transaction (it would see one
    snapshot of the counters throughout)."""
    rows = conn.execute(TOUCHED, {"tables": list(tables)}).fetchall()
    return Touched({(str(t), str(p)): (int(h or 0), int(r or 0)) for t, p, h, r in rows})
