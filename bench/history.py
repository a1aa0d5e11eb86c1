"""History that scales: a drain beside tens of millions of finished rows, and their purge.

What it measures
    On a PostgreSQL cluster of its own with **autovacuum on** (the machine's server runs with it
    off), two databases migrated to the head revision: ``empty``, and ``full``, filled with
    ``--rows`` finished notifications (default 50,000,000) and their attempt history.

    1. **The fill.** 90 % sent, 5 % dead, 5 % cancelled; on ``email`` (61 %), ``webhook``
       (26 %) and ``null`` (13 %); finished evenly over the last 100 days, ids in the order of
       their times, as a producer's rows come. Each row has 1 to 3 attempts (79 %, 16 %, 5 %;
       1.26 on average), five minutes apart and ending when the row finished: retries, then
       the outcome its status says (a cancelled row's last one is the cancel, by
       ``console:ops``). Written by the server (``INSERT ... SELECT ... FROM
       generate_series``), about a million rows a transaction (a tenth of ``--rows`` when
       that is less), with the rows per second printed as it goes; its statement triggers off
       (``session_replication_role = replica``: they act on pending rows and producer logins,
       neither of which this is), its constraints on. Then ``VACUUM ANALYZE`` of both tables.
       When ``notification_attempts`` is partitioned by week (migration 0027), a freshly
       migrated database holds all time before this week in one partition, where the filled
       history would land and from which no retention drops anything; that partition, empty,
       is replaced by one partition a week for the 100 days, in both databases, as 100 days of
       running with the weekly partitions lays it out (``--as-migrated`` keeps the migration's
       layout). The sizes of both tables and of each of their indexes (summed over the
       partitions of a partitioned one) are printed.
    2. **Drains, empty against full.** ``--warm-up`` rounds (default 2) that are printed and not
       counted, then ``--repeat`` rounds (default 2). A bulk load packs each page with whole
       rows and leaves what is over: room for one more drained row in some pages all through the
       table (at 50,000,000 rows, 313,966 of 2,074,281 pages, for a 145-byte row). The free
       space map sends the next inserts, and the next versions of updated rows, there, each to a
       cold page, before the table's end. At 50,000,000 rows that took the first two rounds
       after the fill (75,063 pages with room after the first, 44 after the second; their drains
       0.37 and 0.51 of empty's, their INSERTs 2.8 and 5.0 s against 0.5): the fill's leftover,
       not the history's. Each round prints how many pages of ``full`` still have that room. A
       round: first, in this process, with no worker running, ``CLAIMS`` (10) pairs of a claim
       of 1,000 due rows (``queue.claim_due``, as a worker claims) and the record of its 1,000
       outcomes with their attempts (``queue.record_outcomes``), one of the pair on each
       database, ``empty`` first in one pair and ``full`` in the next, each timed; full's rate
       over empty's, pair by pair. Then, ``empty`` and then ``full``, a worker
       (``--concurrency=2``) and beat with notifier's default settings, and ``--drain`` due
       ``null`` rows (default 100,000) inserted in one statement, timed from the INSERT's commit
       to the last one recorded sent (its ``updated_at``), as ``bench/field.py`` does, with the
       CPU a row cost the worker processes and their PostgreSQL backends, and the shared buffers
       a row touched in each table and index (``bench/pgstats.py``): where ``full`` spends more
       than ``empty``.
    3. **The purge of ``full``**: ``notifier purge --json``, the command operators and beat's
       daily task run, with every retention at 50 days (``NOTIFIER_RETENTION_SENT_DAYS``,
       ``_DEAD_DAYS``, ``_CANCELLED_DAYS``, and ``_HISTORY_DAYS`` when notifier has that
       setting), which expires about half the rows: rows and attempts deleted, seconds (its
       own, from its log line, and with the command's start), seconds per million rows.
       Beside it, a worker drains ``--drain`` due rows once the purge deletes rows, and again
       once it reaches the history's weeks (``notifier_history_weeks``), if it is still running
       by then; their rates are compared with ``full``'s before. Throughout, a thread looks
       every 20 ms whether ``notification_attempts`` is held ``ACCESS EXCLUSIVE`` (as ``DETACH
       PARTITION`` holds it until its transaction ends: every worker's record of outcomes,
       which appends to the history, waits meanwhile) and how many backends wait on a lock.
       Then the sizes again, and once more after a ``VACUUM`` of both tables, with the free
       space it leaves inside them (``pg_freespacemap``) for new rows.

Targets
    ``full``'s drain at least 0.9 of ``empty``'s, on the medians; ``full``'s claim at least
    0.9 of ``empty``'s rate, the median of the pairs' ratios. The exit status is 0 whether
    the target is met or not; 1 if the set-up fails (or the purge command does); 130 when
    interrupted.

How to run it
    From the repository root, as root or as a user who may run PostgreSQL's ``initdb`` (as
    root the cluster runs as ``postgres``), with Redis's ``redis-server`` installed::

        python bench/history.py [--rows N] [--drain N] [--repeat N] [--warm-up N]
                                [--shared-buffers SIZE] [--as-migrated] [--no-purge] [--keep]
                                [--reuse URL]

    The script starts the cluster, then runs itself again inside it (``NOTIFIER_BENCH_POSTGRES``
    naming it) and passes Ctrl-C and SIGTERM on to that run, which stops what it started. The
    cluster: the newest PostgreSQL in ``/usr/lib/postgresql``, ``initdb`` into a new
    folder under ``$TMPDIR`` (default ``/tmp``), a free loopback port, the machine's server
    settings (``shared_buffers`` 128MB unless ``--shared-buffers``, ``synchronous_commit`` and
    ``fsync`` on, ``max_wal_size`` 1GB) but ``autovacuum`` on, with PostgreSQL's default
    autovacuum settings; printed at the start. Everything is stopped and removed at the end,
    unless ``--keep`` (then the cluster keeps running; the command that stops it is printed).
    ``--no-purge`` stops after the drains: with ``--keep``, ``full`` is left as filled (and
    drained), for a look at what the drains do on it, and ``--reuse URL`` (the cluster's URL
    the kept run printed) runs the drains, and the purge unless ``--no-purge``, again on its
    two databases as they are, without a fill; it neither makes nor drops a database.
    A full-size run writes tens of gigabytes there: see the sizes a small run prints, times
    ``50,000,000 / --rows``. A Redis server of the run's own (or the database
    ``NOTIFIER_BENCH_REDIS`` names, flushed before each drain and at the end).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any

# The repository first, and this folder off the path: its email.py would shadow the standard
# library's email package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

import psycopg
from psycopg import sql
from sqlalchemy import Connection

from bench import harness, pgstats
from bench.cluster import Cluster
from bench.common import (
    REPO,
    Conn,
    CpuMeter,
    Services,
    SetupError,
    admin_connect,
    backend_pids,
    database_url,
    load,
    process_tree,
    run_interruptibly,
    server_settings,
    service_env,
    sqlalchemy_url,
    wait_until,
)
from bench.drains import highest_id, insert_due, wait_drained, workers
from bench.harness import Bench, Line, fmt_int, positive
from notifier.db import queue
from notifier.db.engine import make_engine
from notifier.models import AttemptOutcome, Decision
from notifier.settings import Settings

#: Set in the environment of the run inside the cluster this script started.
INSIDE = "NOTIFIER_BENCH_HISTORY_INSIDE"
#: Rows a transaction of the fill writes, at most.
CHUNK = 1_000_000
#: The fill's rows finished over this many days before it started.
DAYS = 100
#: Every retention of the purge: about half of the filled rows are older.
RETENTION_DAYS = 50
#: The in-process claims: this many pairs a round of claims of the default largest batch.
CLAIMS = 10
#: Seconds between two looks of the lock watch.
LOCK_SAMPLE = 0.02
#: Seconds for exited backends to hand their counters of buffers over (``bench/pgstats.py``).
STATS_FLUSHED = 1.0
#: ``full``'s drain must reach this share of ``empty``'s.
TARGET = 0.9
TABLES = ("notifications", "notification_attempts", "notification_queue")
#: What the cluster runs with besides its port and socket folder: the machine's server's
#: settings (bench/testhost.py), autovacuum on.
SERVER = {
    "autovacuum": "on",
    "synchronous_commit": "on",
    "fsync": "on",
    "max_connections": "100",
    "max_wal_size": "1GB",
    "timezone": "UTC",
    "log_autovacuum_min_duration": "0",
}
#: Reported at the start: what the measurements depend on.
SHOWN = (
    "server_version",
    "shared_buffers",
    "autovacuum",
    "autovacuum_naptime",
    "autovacuum_vacuum_scale_factor",
    "autovacuum_vacuum_insert_scale_factor",
    "autovacuum_analyze_scale_factor",
    "autovacuum_vacuum_cost_limit",
    "autovacuum_vacuum_cost_delay",
    "autovacuum_max_workers",
    "maintenance_work_mem",
    "work_mem",
    "max_wal_size",
    "synchronous_commit",
    "fsync",
)

# --- the fill ----------------------------------------------------------------------------------

# One row of the fill per ``g`` of ``:lo`` to ``:hi`` (of ``:n``), its id ``:base + g``. Status,
# channel and attempts come from ``g`` modulo 20, 23 and 19 (pairwise coprime, so the three
# are independent of one another over the table); ``finish``, when the row became sent, dead
# or cancelled, walks evenly from 100 days (less an hour) before ``:t0`` to an hour before it.
FILL_ROWS = f"""
    SELECT g, %(base)s::bigint + g AS id,
           CASE g %% 20 WHEN 0 THEN 'dead' WHEN 1 THEN 'cancelled' ELSE 'sent' END AS status,
           CASE WHEN g %% 23 < 14 THEN 'email' WHEN g %% 23 < 20 THEN 'webhook' ELSE 'null'
           END AS channel,
           CASE WHEN g %% 19 < 15 THEN 1 WHEN g %% 19 < 18 THEN 2 ELSE 3 END AS k,
           %(t0)s::timestamptz - make_interval(days => {DAYS}) + interval '1 hour'
             + make_interval(secs => ({DAYS} * 86400.0 - 7200) * (g - 0.5) / %(n)s) AS finish,
           'w' || (g / 500 %% 4) || ':' || (1000 + g / 500 %% 2) || ':5e1f0' || (g / 500 %% 10)
             AS worker
      FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS g
"""

# The rows as a worker leaves them: the claim's token and worker stay, the lease is cleared; a
# sent email keeps its provider's message id. A cancelled row was cancelled after its k - 1
# attempts (none, mostly), so never claimed when k is 1.
FILL_NOTIFICATIONS = f"""
    INSERT INTO notifications
        (id, channel, recipient, subject, body, payload, status, priority, attempts,
         max_attempts, next_attempt_at, last_error, provider_message_id, claim_token,
         claimed_by, created_at, updated_at, sent_at, provider, producer, category)
    SELECT r.id, r.channel,
           CASE r.channel WHEN 'email' THEN 'u' || (r.g %% 2000003) || '@example.com'
                          WHEN 'webhook' THEN 'https://hooks.example.com/in/' || (r.g %% 2000)
                          ELSE 'bench' END,
           CASE WHEN r.channel = 'email' THEN 'Your order #' || r.g || ' has shipped' END,
           CASE r.channel
               WHEN 'email' THEN 'Hello, your order #' || r.g || ' is on its way. Track it at'
                                 || ' https://shop.example.com/track/' || r.g
                                 || ' - thank you for shopping with us.'
               WHEN 'null' THEN 'row ' || r.g END,
           CASE WHEN r.channel = 'webhook'
                THEN jsonb_build_object('event', 'order.shipped', 'order', r.g,
                                        'at', extract(epoch FROM r.finish)::bigint)
                ELSE '{{}}'::jsonb END,
           r.status, 0,
           CASE WHEN r.status = 'cancelled' THEN r.k - 1 ELSE r.k END,
           5,
           r.finish - interval '1 second',
           CASE r.status WHEN 'dead' THEN
                    CASE r.channel WHEN 'email' THEN '550 5.1.1 mailbox unavailable'
                                   WHEN 'webhook' THEN 'HTTP 410 Gone'
                                   ELSE 'refused' END
                WHEN 'cancelled' THEN 'cancelled: no longer wanted' END,
           CASE WHEN r.status = 'sent' AND r.channel = 'email'
                THEN '<n' || r.g || '@mail.example.com>' END,
           CASE WHEN r.status <> 'cancelled' OR r.k > 1
                THEN md5((r.g / 500)::text)::uuid END,
           CASE WHEN r.status <> 'cancelled' OR r.k > 1 THEN r.worker END,
           r.finish - make_interval(mins => 5 * (r.k - 1), secs => 1 + r.g %% 5),
           r.finish,
           CASE WHEN r.status = 'sent' THEN r.finish END,
           CASE WHEN r.status = 'sent'
                THEN CASE r.channel WHEN 'email' THEN 'smtp' ELSE r.channel END END,
           'shop',
           CASE WHEN r.channel = 'email' THEN 'transactional' END
      FROM ({FILL_ROWS}) AS r
"""

# Attempt j of k, five minutes apart, the last when the row finished: retries, then the
# outcome of its status. A cancel is recorded by the console, with the row's attempts so far.
FILL_ATTEMPTS = f"""
    INSERT INTO notification_attempts
        (notification_id, attempt, at, worker, channel, outcome, error, duration_ms, provider)
    SELECT r.id,
           CASE WHEN j = r.k AND r.status = 'cancelled' THEN r.k - 1 ELSE j END,
           r.finish - make_interval(mins => 5 * (r.k - j)),
           CASE WHEN j = r.k AND r.status = 'cancelled' THEN 'console:ops' ELSE r.worker END,
           r.channel,
           CASE WHEN j < r.k THEN 'retry' ELSE r.status END,
           CASE WHEN j < r.k THEN
                    CASE r.channel WHEN 'email' THEN '421 4.7.0 try again later'
                                   WHEN 'webhook' THEN 'HTTP 503 Service Unavailable'
                                   ELSE 'timed out' END
                WHEN r.status = 'dead' THEN
                    CASE r.channel WHEN 'email' THEN '550 5.1.1 mailbox unavailable'
                                   WHEN 'webhook' THEN 'HTTP 410 Gone'
                                   ELSE 'refused' END
                WHEN r.status = 'cancelled' THEN 'cancelled: no longer wanted' END,
           CASE WHEN j = r.k AND r.status = 'cancelled' THEN NULL ELSE 20 + r.g %% 300 END,
           CASE WHEN j = r.k AND r.status = 'cancelled' THEN NULL
                WHEN r.channel = 'email' THEN 'smtp' ELSE r.channel END
      FROM ({FILL_ROWS}) AS r CROSS JOIN LATERAL generate_series(1, r.k) AS j
"""

# --- sizes -------------------------------------------------------------------------------------

# A relation's leaves: the partitions at the bottom of its tree, or itself when it has none.
LEAVES = """
    SELECT p.relid FROM pg_partition_tree({0}) p WHERE p.isleaf
    UNION ALL
    SELECT {0} WHERE NOT EXISTS (SELECT 1 FROM pg_partition_tree({0}))
"""
# Each table summed over its leaves: table (heap, TOAST, free space and visibility maps), its
# indexes, and how many leaves.
TABLE_SIZES = f"""
    SELECT t.name, sum(pg_table_size(l.relid))::bigint, sum(pg_indexes_size(l.relid))::bigint,
           count(*)
      FROM unnest(%s::text[]) WITH ORDINALITY AS t(name, i)
           CROSS JOIN LATERAL ({LEAVES.format("t.name::regclass")}) AS l
     GROUP BY t.name, t.i
     ORDER BY t.i
"""
# Each index of the two tables, summed over its partitions for a partitioned one.
INDEX_SIZES = f"""
    SELECT i.indrelid::regclass::text, c.relname, sum(pg_relation_size(l.relid))::bigint AS size
      FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
           CROSS JOIN LATERAL ({LEAVES.format("i.indexrelid::regclass")}) AS l
     WHERE i.indrelid = ANY(%s::regclass[])
     GROUP BY 1, 2
     ORDER BY 1, 3 DESC
"""
# Indexes of single partitions that belong to no index of the whole table (a partition's own,
# e.g. kept from before it was attached).
OWN_INDEXES = """
    SELECT t.name, c.relname, pg_relation_size(c.oid)
      FROM unnest(%s::text[]) AS t(name)
           JOIN LATERAL pg_partition_tree(t.name::regclass) p ON p.isleaf AND p.level > 0
           JOIN pg_index i ON i.indrelid = p.relid
           JOIN pg_class c ON c.oid = i.indexrelid
     WHERE NOT EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhrelid = i.indexrelid)
     ORDER BY 3 DESC
"""
# The free space each table's leaves have for new rows, by their free space maps (which a
# VACUUM brings up to date): what a purge freed and a VACUUM made reusable.
FREE_SPACE = f"""
    SELECT t.name, coalesce(sum(f.avail), 0)::bigint
      FROM unnest(%s::text[]) WITH ORDINALITY AS t(name, i)
           CROSS JOIN LATERAL ({LEAVES.format("t.name::regclass")}) AS l
           CROSS JOIN LATERAL pg_freespace(l.relid) AS f
     GROUP BY t.name, t.i
     ORDER BY t.i
"""
# The history's partitions, their bounds and (after an ANALYZE) rows.
PARTITIONS = """
    SELECT c.relname, pg_get_expr(c.relpartbound, c.oid), greatest(c.reltuples, 0)::bigint
      FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
     WHERE i.inhparent = 'notification_attempts'::regclass
     ORDER BY 2
"""
# Is the history held in ACCESS EXCLUSIVE mode (its writers wait), and how many backends wait
# on a lock?
LOCKED = """
    SELECT EXISTS (SELECT 1 FROM pg_locks
                    WHERE locktype = 'relation' AND granted AND mode = 'AccessExclusiveLock'
                      AND relation = 'notification_attempts'::regclass
                      AND database = (SELECT oid FROM pg_database
                                       WHERE datname = current_database())),
           (SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock')
"""
# The Mondays (UTC) from the week ``:days`` before ``:t0`` up to the first week the history
# has a partition for (or to ``:t0``'s week, if it has none).
WEEKS = """
    SELECT generate_series(
        date_trunc('week', (%(t0)s::timestamptz - make_interval(days => %(days)s))
                   AT TIME ZONE 'UTC') AT TIME ZONE 'UTC',
        coalesce(
            (SELECT min(substring(pg_get_expr(c.relpartbound, c.oid)
                                  FROM 'FROM \\(''([^'']+)''\\)')::timestamptz)
               FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
              WHERE i.inhparent = 'notification_attempts'::regclass),
            date_trunc('week', %(t0)s::timestamptz AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
              + interval '7 days') - interval '7 days',
        interval '7 days')
"""


def gib(n: float) -> str:
    """A size in bytes, as MB below a GB, else GB."""
    if n < 2**30:
        return f"{n / 2**20:,.1f} MB"
    return f"{n / 2**30:,.2f} GB"


@dataclass
class Sizes:
    """Both tables and their indexes, in bytes, at one moment."""

    #: table -> (table, indexes, leaves)
    tables: dict[str, tuple[int, int, int]]
    #: (table, index) -> bytes, summed over its partitions
    indexes: dict[tuple[str, str], int]
    #: (table, a partition's own index) -> bytes
    own: dict[tuple[str, str], int]

    def total(self, table: str) -> int:
        own, indexes, _ = self.tables[table]
        return own + indexes

    def show(self, when: str, rows: dict[str, int] | None = None) -> None:
        print(f"  sizes {when}:")
        for table, (own, indexes, leaves) in self.tables.items():
            parts = f", {leaves} partitions" if leaves > 1 else ""
            each = ""
            if rows and rows.get(table):
                each = f"; {(own + indexes) / rows[table]:,.0f} bytes a row of {rows[table]:,}"
            print(
                f"    {table:<24} table {gib(own):>10}  indexes {gib(indexes):>10}"
                f"  total {gib(own + indexes):>10}{parts}{each}"
            )
            for (owner, index), n in self.indexes.items():
                if owner == table:
                    print(f"      {index:<40} {gib(n):>10}")
            for (owner, index), n in self.own.items():
                if owner == table:
                    print(f"      {index:<40} {gib(n):>10}  (a partition's own index)")


def sizes(conn: Conn) -> Sizes:
    tables = {
        str(name): (int(own), int(indexes), int(leaves))
        for name, own, indexes, leaves in conn.execute(TABLE_SIZES, (list(TABLES),)).fetchall()
    }
    indexes = {
        (str(table), str(index)): int(n)
        for table, index, n in conn.execute(INDEX_SIZES, (list(TABLES),)).fetchall()
    }
    own = {
        (str(table), str(index)): int(n)
        for table, index, n in conn.execute(OWN_INDEXES, (list(TABLES),)).fetchall()
    }
    return Sizes(tables, indexes, own)


def free_space(conn: Conn) -> str:
    """The free space inside both tables (``pg_freespacemap``, made in the database if the
    server has it), in words."""
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_freespacemap")
    except psycopg.Error as exc:
        return f"(no pg_freespacemap: {str(exc).strip()})"
    found = conn.execute(FREE_SPACE, (list(TABLES),)).fetchall()
    return ", ".join(f"{name} {gib(int(n))}" for name, n in found)


def on_disk(conn: Conn) -> str:
    """The cluster's databases and WAL, for the disk a run needs."""
    row = conn.execute(
        "SELECT (SELECT sum(pg_database_size(datname)) FROM pg_database)::bigint,"
        " (SELECT coalesce(sum(size), 0) FROM pg_ls_waldir())::bigint"
    ).fetchone()
    assert row is not None
    return f"databases {gib(int(row[0]))}, WAL {gib(int(row[1]))}"


def autovacuums(conn: Conn) -> str:
    """What autovacuum did to the two tables so far, and what it is doing now."""
    row = conn.execute(
        "SELECT coalesce(sum(autovacuum_count) FILTER (WHERE relname = 'notifications'), 0),"
        " coalesce(sum(autoanalyze_count) FILTER (WHERE relname = 'notifications'), 0),"
        " coalesce(sum(autovacuum_count) FILTER (WHERE relname <> 'notifications'), 0),"
        " coalesce(sum(autoanalyze_count) FILTER (WHERE relname <> 'notifications'), 0),"
        " coalesce(sum(n_dead_tup) FILTER (WHERE relname = 'notifications'), 0)"
        " FROM pg_stat_user_tables"
        " WHERE relname = 'notifications' OR relname LIKE 'notification\\_attempts%'"
    ).fetchone()
    running = conn.execute(
        "SELECT string_agg(p.relid::regclass::text || ' (' || p.phase || ')', ', ')"
        " FROM pg_stat_progress_vacuum p WHERE p.datid = ("
        "SELECT oid FROM pg_database WHERE datname = current_database())"
    ).fetchone()
    assert row is not None
    now = f"; vacuuming now: {running[0]}" if running and running[0] else ""
    return (
        f"autovacuum so far: notifications {row[0]} vacuums, {row[1]} analyzes"
        f" ({int(row[4]):,} dead rows now); history {row[2]} vacuums, {row[3]} analyzes{now}"
    )


# --- the history's layout ----------------------------------------------------------------------


def partitioned(conn: Conn) -> bool:
    row = conn.execute(
        "SELECT relkind FROM pg_class WHERE oid = 'notification_attempts'::regclass"
    ).fetchone()
    return row is not None and str(row[0]) == "p"


def weekly(conn: Conn, t0: datetime) -> list[str]:
    """One partition a week for the ``DAYS`` before ``t0``, in place of an empty partition for
    all time before some week (``FROM (MINVALUE)``), as migration 0027 leaves a fresh database;
    named as ``notifier_history_weeks`` names the weeks it makes. What was done, in words."""
    done: list[str] = []
    for name, bound, _ in conn.execute(PARTITIONS).fetchall():
        if "MINVALUE" not in str(bound):
            continue
        table = sql.Identifier(str(name))
        row = conn.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(table)).fetchone()
        if row is None or row[0]:
            done.append(f"kept {name} ({bound}): it holds rows")
            continue
        conn.execute(sql.SQL("ALTER TABLE notification_attempts DETACH PARTITION {}").format(table))
        conn.execute(sql.SQL("DROP TABLE {}").format(table))
        done.append(f"dropped the empty {name} ({bound})")
    weeks = conn.execute(WEEKS, {"t0": t0, "days": DAYS + 1}).fetchall()
    for (starts,) in weeks:
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} PARTITION OF notification_attempts"
                " FOR VALUES FROM ({}) TO ({}::timestamptz + interval '7 days')"
            ).format(
                sql.Identifier(f"notification_attempts_w{starts:%Y%m%d}"),
                sql.Literal(starts),
                sql.Literal(starts),
            )
        )
    if weeks:
        done.append(
            f"made {len(weeks)} weeks from {weeks[0][0]:%Y-%m-%d} to {weeks[-1][0]:%Y-%m-%d}"
        )
    return done


def history_partitions(conn: Conn) -> str:
    """The history's partitions that hold rows (estimates, after an ANALYZE)."""
    found = conn.execute(PARTITIONS).fetchall()
    held = [(str(name), int(n)) for name, _, n in found if int(n) > 0]
    listed = ", ".join(f"{name.removeprefix('notification_attempts_')} {n:,}" for name, n in held)
    return f"{len(found)} partitions, {len(held)} holding rows: {listed or 'none'}"


# --- the fill ----------------------------------------------------------------------------------


@dataclass
class Fill:
    rows: int
    attempts: int
    seconds: float
    vacuum_seconds: float

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else math.nan


def fill(conn: Conn, rows: int, t0: datetime) -> Fill:
    """``rows`` finished notifications and their attempts, a chunk a transaction."""
    chunk = min(CHUNK, max(rows // 10, 10_000))
    base = highest_id(conn)
    conn.execute("SET session_replication_role = replica")
    started = time.monotonic()
    attempts = 0
    try:
        for lo in range(1, rows + 1, chunk):
            hi = min(lo + chunk - 1, rows)
            params = {"base": base, "t0": t0, "n": rows, "lo": lo, "hi": hi}
            began = time.monotonic()
            with conn.transaction():
                conn.execute(FILL_NOTIFICATIONS, params)
                attempts += conn.execute(FILL_ATTEMPTS, params).rowcount
            took = time.monotonic() - began
            elapsed = time.monotonic() - started
            print(
                f"    {hi:>13,} of {rows:,} rows, {attempts:,} attempts; this chunk"
                f" {(hi - lo + 1) / took:,.0f} rows/s, so far {hi / elapsed:,.0f} rows/s"
                f" ({elapsed:,.0f}s; load {load()})",
                flush=True,
            )
    except psycopg.errors.CheckViolation as exc:
        if "no partition of relation" in str(exc):
            raise SetupError(
                f"the history has no partition for some attempts of the fill ({exc}): the"
                f" fill writes attempts within the last {DAYS} days; make weeks for them first"
            ) from exc
        raise
    seconds = time.monotonic() - started
    conn.execute("RESET session_replication_role")
    conn.execute("SELECT setval(pg_get_serial_sequence('notifications', 'id'), %s)", (base + rows,))
    began = time.monotonic()
    conn.execute("VACUUM ANALYZE notifications, notification_attempts")
    return Fill(rows, attempts, seconds, time.monotonic() - began)


# --- drains ------------------------------------------------------------------------------------


@dataclass
class Drained:
    """Due rows drained by a worker: how many, how long (the database's clock), CPU."""

    rows: int
    sent: int
    seconds: float
    insert_seconds: float
    timed_out: bool
    worker_cpu: float = math.nan
    postgres_cpu: float = math.nan

    @property
    def rate(self) -> float:
        return self.sent / self.seconds if self.seconds > 0 else math.nan

    def describe(self) -> str:
        text = (
            f"{self.sent:,} of {self.rows:,} rows in {self.seconds:.2f}s = {fmt_int(self.rate)}"
            f" rows/s (the INSERT {self.insert_seconds:.2f}s)"
        )
        if math.isfinite(self.worker_cpu):
            us = 1e6 / max(self.sent, 1)
            text += (
                f"; CPU a row {self.worker_cpu * us:.0f} us worker"
                f" + {self.postgres_cpu * us:.0f} us PostgreSQL"
            )
        return text + (" TIMED OUT" if self.timed_out else "")


def drain_due(
    conn: Conn,
    database: str,
    services: Services,
    rows: int,
    *,
    cpu: bool = True,
) -> Drained:
    """Insert ``rows`` due ``null`` rows and wait until none is pending or processing; counts
    only rows of this insert (ids above the highest before it). With ``cpu``, the CPU of the
    worker processes and of the database's backends (all of them: leave it off when others
    than the worker's are busy)."""
    floor = highest_id(conn)
    worker = services.pid("worker")
    cpu_workers, cpu_backends = CpuMeter(), CpuMeter()
    cpu_workers.start(process_tree(worker))
    cpu_backends.start(backend_pids(conn, database))

    def sample() -> None:
        cpu_workers.sample(process_tree(worker))
        cpu_backends.sample(backend_pids(conn, database))

    insert_s, committed = insert_due(conn, rows, "null", "bench")
    timed_out = wait_drained(conn, services, 60 + rows / 500, sample)
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE status = 'sent'),"
        " extract(epoch FROM max(updated_at) FILTER (WHERE status = 'sent'))::float8"
        " FROM notifications WHERE id > %s",
        (floor,),
    ).fetchone()
    assert row is not None
    sent, last = int(row[0]), row[1]
    seconds = float(last) - committed if last is not None else math.nan
    drained = Drained(rows, sent, seconds, insert_s, timed_out)
    if cpu:
        drained.worker_cpu, drained.postgres_cpu = cpu_workers.seconds, cpu_backends.seconds
    return drained


@dataclass
class Claims:
    """Milliseconds of each in-process claim of a batch, and of the record of its outcomes."""

    claim_ms: list[float]
    record_ms: list[float]

    def describe(self, batch: int) -> str:
        return (
            f"claim of {batch:,} rows {statistics.median(self.claim_ms):.1f} ms, record of their"
            f" outcomes and attempts {statistics.median(self.record_ms):.1f} ms (medians of"
            f" {len(self.claim_ms)})"
        )


def claim_and_record(db: Connection, batch: int, into: Claims) -> None:
    """One claim of ``batch`` due rows and the record of their outcomes (sent), each timed
    and in its own transaction, as a worker's dispatcher does (no sends, no Celery)."""
    token = uuid.uuid4()
    began = time.perf_counter()
    with db.begin():
        claimed = queue.claim_due(
            db, limit=batch, lease_seconds=300, token=token, worker="bench:0:claims"
        )
    into.claim_ms.append((time.perf_counter() - began) * 1000)
    now = time.time()
    sent = [
        Decision(n.id, n.channel, AttemptOutcome.sent, provider="null", sent_at=now)
        for n in claimed
    ]
    began = time.perf_counter()
    with db.begin():
        queue.record_outcomes(db, token, sent, "bench:0:claims")
    into.record_ms.append((time.perf_counter() - began) * 1000)
    if len(claimed) != batch:
        raise SetupError(f"a claim took {len(claimed)} of {batch} due rows")


def paired_claims(empty: Database, full: Database, batch: int) -> None:
    """``CLAIMS`` due batches inserted at once in each database, then claimed and recorded in
    pairs, one on each, in turn (``empty`` first in one pair, ``full`` in the next): what
    else the machine is doing, and the other database's drain before, weigh on both alike."""
    for db in (empty, full):
        with psycopg.connect(db.url, autocommit=True) as conn:
            insert_due(conn, batch * CLAIMS, "null", "bench")
    results = {db.tag: Claims([], []) for db in (empty, full)}
    with contextlib.ExitStack() as stack:
        opened: list[tuple[Database, Connection]] = []
        for db in (empty, full):
            engine = make_engine(sqlalchemy_url(db.url))
            stack.callback(engine.dispose)
            opened.append((db, stack.enter_context(engine.connect())))
        for pair in range(CLAIMS):
            for db, connection in opened if pair % 2 == 0 else reversed(opened):
                claim_and_record(connection, batch, results[db.tag])
    for db in (empty, full):
        db.claims.append(results[db.tag])
        print(f"  {db.tag:<5} {db.claims[-1].describe(batch)}", flush=True)
    ratios = " ".join(
        f"{e / f:.2f}"
        for e, f in zip(results["empty"].claim_ms, results["full"].claim_ms, strict=True)
    )
    print(f"  claims, full's rate / empty's, pair by pair: {ratios}", flush=True)


@dataclass
class Database:
    """One of the two databases and what its rounds measured."""

    tag: str
    name: str
    url: str
    drains: list[Drained] = field(default_factory=list)
    claims: list[Claims] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(d.rate for d in self.drains)

    def claim_median(self, which: str) -> float:
        return float(statistics.median(ms for c in self.claims for ms in getattr(c, which)))


def claim_ratio(empty: Database, full: Database) -> float:
    """The median, over every pair of claims, of full's claim rate over empty's."""
    return statistics.median(
        e / f
        for ce, cf in zip(empty.claims, full.claims, strict=True)
        for e, f in zip(ce.claim_ms, cf.claim_ms, strict=True)
    )


def row_room(conn: Conn) -> str:
    """Pages of ``notifications`` whose free space (as its free space map records it) holds
    one more drained row: where the next rows inserted, and the next versions of rows
    updated, go before the table's end. A bulk-filled table has such room all through it, in
    cold pages. The row's size is a drained row's, inserted and rolled back."""
    with conn.transaction(force_rollback=True):
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_freespacemap")
        row = conn.execute(
            "INSERT INTO notifications (channel, recipient, subject, body)"
            " VALUES ('null', 'bench', 'bench', 'row 100000')"
            " RETURNING pg_column_size(notifications.*)"
        ).fetchone()
        assert row is not None
        needed = int(row[0]) + 4  # and its line pointer
        room = conn.execute(
            "SELECT count(*) FILTER (WHERE avail >= %s), count(*)"
            " FROM pg_freespace('notifications')",
            (needed,),
        ).fetchone()
        assert room is not None
    return (
        f"{int(room[0]):,} of {int(room[1]):,} pages with room for a drained row ({needed} bytes)"
    )


def round_of(bench: Bench, empty: Database, full: Database, batch: int) -> None:
    with psycopg.connect(full.url, autocommit=True) as conn:
        print(f"  full  {row_room(conn)}", flush=True)
    paired_claims(empty, full, batch)
    for db in (empty, full):
        drain_of(bench, db)


def drain_of(bench: Bench, db: Database) -> None:
    with psycopg.connect(db.url, autocommit=True) as conn:
        time.sleep(STATS_FLUSHED)  # the claims' backends have handed over their counters
        before = pgstats.touched(conn, TABLES)
    with workers(bench, db.tag, db.name, db.url, {}) as (services, conn):
        db.drains.append(drain_due(conn, db.name, services, bench.args.drain))
    print(f"  {db.tag:<5} drain {db.drains[-1].describe()}; load {load()}", flush=True)
    with psycopg.connect(db.url, autocommit=True) as conn:
        time.sleep(STATS_FLUSHED)  # and the workers' backends, which exited with them
        spent = pgstats.touched(conn, TABLES).minus(before)
    print(f"  {db.tag:<5} buffers a row: {spent.per_row(bench.args.drain)}", flush=True)
    if db.drains[-1].sent != bench.args.drain:
        raise SetupError(f"({db.tag}) sent {db.drains[-1].sent:,} of {bench.args.drain:,} rows")


# --- the purge ---------------------------------------------------------------------------------


@dataclass
class Beside:
    """A drain beside the purge, and how the two overlapped."""

    what: str
    drain: Drained
    #: seconds from the purge command's start to the drain's INSERT
    began: float
    #: seconds the purge went on after the drain ended (negative: it ended first)
    after: float

    def overlap(self) -> str:
        text = f"its INSERT {self.began:.1f}s after the purge's start; "
        if self.after > 0:
            return text + f"the purge went on {self.after:.1f}s after it"
        return text + f"the purge ended {-self.after:.1f}s before it: only partly beside it"


@dataclass
class Locked:
    """What the lock watch saw: the history locked against writers (``ACCESS EXCLUSIVE``, as
    ``DETACH PARTITION`` takes it, until its transaction ends), and backends waiting on locks."""

    seconds: float = 0.0
    longest: float = 0.0
    times: int = 0
    most_waiting: int = 0
    error: str | None = None

    def describe(self) -> str:
        if self.error:
            return f"the lock watch failed: {self.error}"
        if not self.times:
            return (
                f"notification_attempts never seen locked against writers (sampled every"
                f" {LOCK_SAMPLE * 1000:.0f} ms); at most {self.most_waiting} backends waiting"
                " on a lock"
            )
        return (
            f"notification_attempts locked against writers {self.times} times,"
            f" {self.seconds:.2f}s in all, the longest {self.longest:.2f}s (sampled every"
            f" {LOCK_SAMPLE * 1000:.0f} ms); at most {self.most_waiting} backends waiting on a lock"
        )


class LockWatch:
    """Samples, in a thread of its own, whether a transaction holds ``notification_attempts``
    in ``ACCESS EXCLUSIVE`` mode (every worker's record of outcomes, which appends to it, then
    waits) and how many backends wait on a lock."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.found = Locked()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="lock-watch", daemon=True)

    def __enter__(self) -> LockWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _watch(self) -> None:
        since: float | None = None
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                while not self._stop.is_set():
                    row = conn.execute(LOCKED).fetchone()
                    now = time.monotonic()
                    held, waiting = (bool(row[0]), int(row[1])) if row else (False, 0)
                    self.found.most_waiting = max(self.found.most_waiting, waiting)
                    if held and since is None:
                        since = now
                    elif not held and since is not None:
                        self._stretch(now - since)
                        since = None
                    time.sleep(LOCK_SAMPLE)
        except psycopg.Error as exc:
            self.found.error = str(exc).strip()
        if since is not None:
            self._stretch(time.monotonic() - since)

    def _stretch(self, seconds: float) -> None:
        self.found.times += 1
        self.found.seconds += seconds
        self.found.longest = max(self.found.longest, seconds)


@dataclass
class Purged:
    report: dict[str, Any]
    wall_seconds: float
    own_seconds: float | None
    beside: list[Beside]
    locked: Locked

    @property
    def deleted(self) -> int:
        found = self.report.get("deleted", {})
        return sum(int(n) for n in found.values()) if isinstance(found, dict) else 0

    @property
    def attempts(self) -> int:
        found = self.report.get("attempts", 0)
        return found if isinstance(found, int) else 0

    @property
    def seconds(self) -> float:
        return self.own_seconds if self.own_seconds is not None else self.wall_seconds


def retention() -> dict[str, str]:
    """Every retention notifier has, at ``RETENTION_DAYS`` (the history's only if it is a
    setting: an unknown ``NOTIFIER_*`` variable is refused)."""
    names = [
        "retention_sent_days",
        "retention_dead_days",
        "retention_cancelled_days",
        "retention_history_days",
    ]
    return {n: str(RETENTION_DAYS) for n in names if n in Settings.model_fields}


def purging(conn: Conn, what: str) -> bool:
    """Does a backend of ``conn``'s database run (or did it last run) a statement like
    ``what``, e.g. the purge's ``DELETE FROM notifications``?"""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid() AND query ILIKE %s)",
        (f"%{what}%",),
    ).fetchone()
    return bool(row and row[0])


def purge(bench: Bench, db: Database) -> Purged:
    """``notifier purge --json`` on ``db``, with a lock watch on the history throughout, and
    drains of ``--drain`` rows beside it: once it deletes rows, and once it reaches the
    history's weeks (if it is still running by then and has weeks to keep)."""
    workdir = bench.workdir / f"purge-{time.monotonic_ns()}"
    workdir.mkdir()
    settings = retention()
    env = service_env(db.url, bench.redis, workdir, settings)
    argv = [sys.executable, "-m", "notifier.cli", "purge", "--json"]
    print(
        f"  {shlex.join(['notifier', *argv[3:]])} with "
        + " ".join(f"NOTIFIER_{k.upper()}={v}" for k, v in settings.items()),
        flush=True,
    )
    rows = bench.args.drain
    #: (what, the drain, its INSERT and its end, from the command's start)
    drains: list[tuple[str, Drained, float, float]] = []
    with (
        (workdir / "purge.out").open("wb") as out,
        (workdir / "purge.err").open("wb") as err,
        workers(bench, "full-purge", db.name, db.url, {}) as (services, conn),
        LockWatch(db.url) as watch,
    ):
        started = time.monotonic()
        proc = subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=out, stderr=err, start_new_session=True
        )
        ends: list[float] = []  # when the command ended, as it ends, not when next looked at

        def wait_for_end() -> None:
            proc.wait()
            ends.append(time.monotonic())

        waiter = threading.Thread(target=wait_for_end, name="purge-end")
        waiter.start()
        try:
            # Each drain begins once the purge is at it, not while its command starts.
            wait_until(
                lambda: proc.poll() is not None or purging(conn, "DELETE FROM notifications"),
                120,
                "the purge's first DELETE",
            )
            for what, statement in (
                ("its deletes", None),
                ("its weeks of history", "notifier_history_weeks"),
            ):
                while statement and proc.poll() is None and not purging(conn, statement):
                    services.check_alive()
                    time.sleep(0.05)
                if proc.poll() is not None:
                    break
                began = time.monotonic() - started
                drained = drain_due(conn, db.name, services, rows, cpu=False)
                drains.append((what, drained, began, time.monotonic() - started))
            status = proc.wait()
            waiter.join()
            ended = ends[0] - started
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait()
            waiter.join()
    beside = [Beside(what, d, began, ended - end) for what, d, began, end in drains]
    said = (workdir / "purge.err").read_text(errors="replace")
    printed = (workdir / "purge.out").read_text(errors="replace")
    if status:
        raise SetupError(f"notifier purge exited {status}: {(said or printed).strip()[-600:]}")
    objects = [line for line in printed.splitlines() if line.startswith("{")]
    if not objects:
        raise SetupError(f"notifier purge printed no JSON: {printed.strip()[-300:]}")
    print(f"  notifier purge printed {objects[-1]}")
    took = re.findall(r"\btook=([0-9.]+)s?", said)
    own = float(took[-1]) if took else None
    return Purged(json.loads(objects[-1]), ended, own, beside, watch.found)


# --- the measurement ---------------------------------------------------------------------------


def kept_databases() -> list[tuple[str, str]]:
    """``empty`` and ``full`` of an earlier run on this cluster (``--reuse``): names and URLs."""
    with admin_connect() as admin:
        found = [
            str(row[0])
            for row in admin.execute(
                "SELECT datname FROM pg_database"
                " WHERE datname LIKE 'notifier\\_bench\\_history\\_%' ORDER BY datname"
            )
        ]
    names = []
    for tag in ("empty", "full"):
        ours = [n for n in found if n.startswith(f"notifier_bench_history_{tag}_")]
        if len(ours) != 1:
            raise SetupError(f"--reuse: {len(ours)} databases of {tag} on the cluster, not one")
        names.append((ours[0], database_url(ours[0])))
    return names


def measure(bench: Bench) -> None:
    args = bench.args
    batch = Settings.model_fields["max_batch_size"].default
    if args.reuse:
        print("\n1-2. the databases of an earlier run, as it left them (--reuse): no fill")
        names = kept_databases()
    else:
        print("\n1. the databases")
        names = [bench.database(f"history_{tag}") for tag in ("empty", "full")]
    empty, full = (
        Database(tag, n, u) for tag, (n, u) in zip(("empty", "full"), names, strict=True)
    )
    with psycopg.connect(full.url, autocommit=True) as conn:
        shown = server_settings(conn, SHOWN)
        bench.settings_used.append(
            "of the cluster: " + ", ".join(f"{k} {v}" for k, v in shown.items())
        )
        print("  the cluster runs with " + ", ".join(f"{k} {v}" for k, v in shown.items()))
        row = conn.execute("SELECT now()").fetchone()
        assert row is not None
        t0: datetime = row[0]
        layout = "partitioned by week" if partitioned(conn) else "one table"
    print(f"  notification_attempts: {layout}")
    if args.reuse:
        with psycopg.connect(full.url, autocommit=True) as conn:
            before = sizes(conn)
            before.show("of full as the earlier run left it")
        bench.notes.append(f"--reuse: {full.name} and {empty.name} as an earlier run left them")
    else:
        before = make_databases(bench, empty, full, layout, t0)
    drains(bench, empty, full, batch)
    if args.no_purge:
        print("\n(--no-purge: no purge, and no sizes after one)")
        return
    purge_and_sizes(bench, full, layout, before)


def make_databases(
    bench: Bench, empty: Database, full: Database, layout: str, t0: datetime
) -> Sizes:
    """The history's weeks laid out, and ``full`` filled; its sizes after the fill."""
    args = bench.args
    if layout != "one table" and args.as_migrated:
        bench.notes.append(
            "--as-migrated: the history's partitions as a fresh migration makes them (the"
            " filled history in the partition before this week, which no retention drops)"
        )
    if layout != "one table" and not args.as_migrated:
        for db in (empty, full):
            with psycopg.connect(db.url, autocommit=True) as conn:
                for said in weekly(conn, t0):
                    print(f"  ({db.tag}) history: {said}")

    print(f"\n2. the fill of full: {args.rows:,} finished rows over {DAYS} days, and their history")
    with psycopg.connect(full.url, autocommit=True) as conn:
        filled = fill(conn, args.rows, t0)
        with psycopg.connect(empty.url, autocommit=True) as other:
            other.execute("VACUUM ANALYZE notifications, notification_attempts")
        print(
            f"  filled {filled.rows:,} rows and {filled.attempts:,} attempts in"
            f" {filled.seconds:,.1f}s = {fmt_int(filled.rate)} rows/s"
            f" ({fmt_int(filled.attempts / filled.seconds)} attempts/s);"
            f" VACUUM ANALYZE {filled.vacuum_seconds:,.1f}s"
        )
        if layout != "one table":
            print(f"  history: {history_partitions(conn)}")
        before = sizes(conn)
        counts = {"notifications": filled.rows, "notification_attempts": filled.attempts}
        before.show("of full after the fill and its VACUUM ANALYZE", counts)
        print(f"  on disk: {on_disk(conn)}")
    bench.lines.append(
        Line(
            "fill of full",
            f"{fmt_int(filled.rows)} rows + {fmt_int(filled.attempts)} attempts in"
            f" {filled.seconds:,.0f}s = {fmt_int(filled.rate)} rows/s; VACUUM ANALYZE"
            f" {filled.vacuum_seconds:,.0f}s",
        )
    )
    for table in TABLES:
        own, indexes, _ = before.tables[table]
        bench.lines.append(
            Line(f"size of {table}", f"{gib(own)} + indexes {gib(indexes)} = {gib(own + indexes)}")
        )
    return before


def drains(bench: Bench, empty: Database, full: Database, batch: int) -> None:
    """``--warm-up`` rounds, not counted, then ``--repeat`` rounds of empty then full."""
    args = bench.args
    print(
        f"\n3. drains: {args.drain:,} due null rows, 2 worker processes, default settings;"
        f" {args.warm_up} warm-up rounds (not counted), then {args.repeat} rounds, empty then full"
    )
    for round_ in range(1, args.warm_up + 1):
        print(f"  warm-up round {round_} of {args.warm_up} (load {load()})", flush=True)
        round_of(bench, empty, full, batch)
    if args.warm_up:
        warm = " ".join(
            f"{f.rate / e.rate:.2f}" for e, f in zip(empty.drains, full.drains, strict=True)
        )
        bench.notes.append(f"warm-up rounds, full / empty, not counted: {warm}")
        for db in (empty, full):
            db.drains.clear()
            db.claims.clear()
    for round_ in range(1, args.repeat + 1):
        print(f"  round {round_} of {args.repeat} (load {load()})", flush=True)
        round_of(bench, empty, full, batch)
    with psycopg.connect(full.url, autocommit=True) as conn:
        print(f"  full: {autovacuums(conn)}")
    ratio = full.median / empty.median
    rounds = " ".join(
        f"{f.rate / e.rate:.2f}" for e, f in zip(empty.drains, full.drains, strict=True)
    )
    for db in (empty, full):
        rates = ", ".join(fmt_int(d.rate) for d in db.drains)
        bench.lines.append(Line(f"drain, {db.tag}", f"{fmt_int(db.median)} rows/s ({rates})"))
    bench.lines.append(
        Line(
            "drain, full / empty (medians)",
            f"{ratio:.2f}; rounds {rounds}",
            f">= {TARGET}",
            "PASS" if ratio >= TARGET else "FAIL",
        )
    )
    claims = claim_ratio(empty, full)
    bench.lines.append(
        Line(
            f"claim, {batch:,} rows, full's rate / empty's (median of pairs)",
            f"{claims:.2f}; {empty.claim_median('claim_ms'):.1f} / "
            f"{full.claim_median('claim_ms'):.1f} ms",
            f">= {TARGET}",
            "PASS" if claims >= TARGET else "FAIL",
        )
    )
    bench.lines.append(
        Line(
            f"record of outcomes + attempts, {batch:,} rows, empty / full",
            f"{empty.claim_median('record_ms'):.1f} / {full.claim_median('record_ms'):.1f} ms",
        )
    )


def purge_and_sizes(bench: Bench, full: Database, layout: str, before: Sizes) -> None:
    args = bench.args
    print(f"\n4. the purge of full, retention {RETENTION_DAYS} days, a drain beside it")
    purged = purge(bench, full)
    per_million = purged.seconds / (purged.deleted / 1e6) if purged.deleted else math.nan
    started = (
        f" ({purged.wall_seconds:.1f}s with the command's start)" if purged.own_seconds else ""
    )
    print(
        f"  deleted {purged.deleted:,} rows and {purged.attempts:,} attempts in"
        f" {purged.seconds:.1f}s{started} = {per_million:.1f}s a million rows"
    )
    print(f"  {purged.locked.describe()}")
    bench.lines.append(
        Line(
            "purge of full",
            f"{fmt_int(purged.deleted)} rows + {fmt_int(purged.attempts)} attempts in"
            f" {purged.seconds:,.1f}s = {per_million:,.1f}s a million rows",
        )
    )
    bench.lines.append(
        Line(
            "history locked against writers during the purge",
            f"longest {purged.locked.longest:.2f}s, {purged.locked.seconds:.2f}s in all",
        )
    )
    for one in purged.beside:
        print(f"  drain beside {one.what}: {one.drain.describe()}; {one.overlap()}")
        bench.lines.append(
            Line(
                f"drain beside the purge's {one.what.removeprefix('its ')}",
                f"{fmt_int(one.drain.rate)} rows/s = {one.drain.rate / full.median:.2f} of full's"
                + ("" if one.after > 0 else " (the purge ended first)"),
            )
        )
        if one.drain.sent != args.drain:
            bench.notes.append(
                f"beside the purge's {one.what}, {one.drain.sent:,} of {args.drain:,} rows sent"
            )
    if len(purged.beside) < 2:
        print("  (the purge ended before a drain could begin beside its weeks of history)")

    print("\n5. sizes after the purge")
    with psycopg.connect(full.url, autocommit=True) as conn:
        print(f"  {autovacuums(conn)}")
        after = sizes(conn)
        after.show("of full right after the purge")
        if layout != "one table":
            print(f"  history: {history_partitions(conn)}")
        began = time.monotonic()
        conn.execute("VACUUM notifications, notification_attempts")
        vacuum_s = time.monotonic() - began
        vacuumed = sizes(conn)
        vacuumed.show(f"of full after a VACUUM of both tables ({vacuum_s:,.1f}s)")
        free = free_space(conn)
        print(f"  free space inside the tables, for new rows: {free}")
        print(f"  {autovacuums(conn)}")
        print(f"  on disk: {on_disk(conn)}")
    for table in TABLES:
        bench.lines.append(
            Line(
                f"size of {table} after the purge",
                f"{gib(after.total(table))}; after a VACUUM {gib(vacuumed.total(table))}"
                f" (before {gib(before.total(table))})",
            )
        )
    bench.lines.append(Line("VACUUM after the purge", f"{vacuum_s:,.1f}s; free inside: {free}"))


# --- the cluster -------------------------------------------------------------------------------


def on_own_cluster(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Start a cluster, run this script again inside it (``NOTIFIER_BENCH_POSTGRES`` naming
    it), stop and remove the cluster (unless ``--keep``). Ctrl-C and SIGTERM are passed on to
    the run inside, which stops what it started."""
    try:
        cluster = Cluster(
            {"shared_buffers": args.shared_buffers, **SERVER},
            prefix="notifier-bench-history-pg-",
            keep=args.keep,
        )
    except (SetupError, OSError, KeyError) as exc:
        print(f"setup failed: cannot make a PostgreSQL cluster: {exc}", file=sys.stderr)
        return 1
    try:
        cluster.start()
    except (SetupError, OSError, subprocess.SubprocessError) as exc:
        print(f"setup failed: cannot start a PostgreSQL cluster: {exc}", file=sys.stderr)
        return 1
    try:
        print(
            f"a PostgreSQL cluster of this run's own: {cluster.url} ({cluster.bin}), data in"
            f" {cluster.data}; started with {cluster.options()}",
            flush=True,
        )
        env = {**os.environ, "NOTIFIER_BENCH_POSTGRES": cluster.url, INSIDE: "1"}
        child = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), *argv],
            cwd=REPO,
            env=env,
            start_new_session=True,  # signals reach it once, from here
        )

        def pass_on(signum: int, _: FrameType | None) -> None:
            # As SIGTERM, which it always handles (SIGINT may have been ignored since its start,
            # as in a shell's background job).
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM)

        signal.signal(signal.SIGINT, pass_on)
        signal.signal(signal.SIGTERM, pass_on)
        return child.wait()
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the clean-up is not to be cut short
        if cluster.keep:
            print(
                f"kept the cluster running: {cluster.url}; stop it with"
                f" {shlex.join(cluster.pg_ctl('-m', 'fast', 'stop'))} and remove {cluster.dir}"
            )
        cluster.close()


def main(argv: Sequence[str] | None = None) -> int:
    made = harness.parser(__doc__, ["keep"])
    made.add_argument(
        "--rows",
        type=positive,
        default=50_000_000,
        help="finished notifications in full (default 50,000,000)",
    )
    made.add_argument(
        "--drain", type=positive, default=100_000, help="due rows per drain (default 100,000)"
    )
    made.add_argument(
        "--repeat", type=positive, default=2, help="rounds of empty then full (default 2)"
    )
    made.add_argument(
        "--shared-buffers",
        default="128MB",
        metavar="SIZE",
        help="the cluster's shared_buffers (default 128MB, as the machine's server)",
    )
    made.add_argument(
        "--as-migrated",
        action="store_true",
        help="leave a partitioned history's partitions as the migration makes them",
    )
    made.add_argument(
        "--no-purge", action="store_true", help="stop after the drains (full stays as filled)"
    )
    made.add_argument(
        "--warm-up",
        type=int,
        default=2,
        metavar="N",
        help="rounds run first and not counted (default 2: the first after a fill go to its"
        " pages' leftover room, cold)",
    )
    made.add_argument(
        "--reuse",
        metavar="URL",
        help="the cluster an earlier --keep run left running: its databases, no fill",
    )
    given = list(sys.argv[1:] if argv is None else argv)
    args = harness.parse(made, given)
    if os.environ.get(INSIDE) == "1":
        return run_interruptibly(
            lambda a: harness.run("history at scale", harness.REDIS, a, [measure]), args
        )
    if args.reuse:  # its databases are the earlier run's: none is made, none dropped
        env = {**os.environ, "NOTIFIER_BENCH_POSTGRES": args.reuse, INSIDE: "1"}
        again = [sys.executable, str(Path(__file__).resolve()), *given]
        return subprocess.run(again, env=env, cwd=REPO, check=False).returncode
    return on_own_cluster(args, given)


if __name__ == "__main__":
    sys.exit(main())
