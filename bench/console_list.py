"""How long the console's list takes on a large table.

Fills a scratch database with ``--rows`` notifications (10 million by default, written by one
``INSERT ... SELECT generate_series``: a few percent dead, pending, cancelled, 1 % of them in a
campaign, the rest sent, created over 30 days), then times each list query the console runs
(the page's rows and, for a time range, the binary search for its ids), the median of
``--repeat`` runs, and drops the database.

    python bench/console_list.py [--rows 10000000] [--repeat 5] [--keep]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

# The repository first, and this folder off the path: its email.py would shadow the standard
# library's email package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

from sqlalchemy import create_engine, text

from bench.common import database_url, drop_databases, recreate_database, sqlalchemy_url
from notifier.db import listing

DATABASE = "notifier_bench_console"

FILL = """
    INSERT INTO notifications (channel, recipient, subject, status, attempts, last_error,
                               sent_at, dedupe_key, campaign_id, created_at, updated_at)
    SELECT (ARRAY['email', 'sms', 'webhook', 'push'])[1 + g % 4],
           'user' || (g % 2000000) || '@example.com', 'Order ' || g,
           s.status, CASE WHEN s.status = 'dead' THEN 5 ELSE 1 END,
           CASE WHEN s.status = 'dead' THEN 'gave up after 5 attempts; last error: 503'
                WHEN s.status = 'cancelled' THEN 'expired' END,
           CASE WHEN s.status = 'sent' THEN t.at END,
           'order:' || g, CASE WHEN g % 100 = 0 AND g <= 2000000 THEN 1 END, t.at, t.at
      FROM generate_series(1, :rows) AS g
     CROSS JOIN LATERAL (SELECT now() - interval '30 days' * (1 - g::float8 / :rows) AS at) t
     CROSS JOIN LATERAL (SELECT CASE WHEN g % 50 = 7 THEN 'dead' WHEN g % 40 = 3 THEN 'cancelled'
                                     WHEN g > :rows - 20000 THEN 'pending'
                                     ELSE 'sent' END AS status) s
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    args = parser.parse_args()

    url = sqlalchemy_url(database_url(DATABASE))
    existing = create_engine(url)
    try:
        with existing.connect() as conn:
            have = conn.execute(text("SELECT count(*) FROM notifications")).scalar_one()
    except Exception:
        have = -1
    existing.dispose()
    if have != args.rows:
        recreate_database(DATABASE)
        engine = create_engine(url)
        started = time.monotonic()
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO campaigns (id, name, channel, status)"
                    " VALUES (1, 'spring', 'email', 'running')"
                )
            )
            conn.execute(text(FILL), {"rows": args.rows})
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(
                text("VACUUM ANALYZE notifications")
            )
        print(f"filled {args.rows:,} rows in {time.monotonic() - started:.0f}s")
    else:
        engine = create_engine(url)

    now = datetime.now(UTC)
    with engine.connect() as conn:
        last = int(conn.execute(text("SELECT max(id) FROM notifications")).scalar_one())
    cases: list[tuple[str, dict[str, Any]]] = [
        ("first page, no filter", {}),
        ("page 2,000 deep (id < max - 100k)", {"before": last - 100_000}),
        ("status = dead", {"status": "dead"}),
        ("status = dead, channel = sms", {"status": "dead", "channel": "sms"}),
        ("campaign = spring", {"campaign": "spring"}),
        ("dedupe key", {"dedupe_key": f"order:{last // 2}"}),
        ("error contains '503'", {"error": "503"}),
        (
            "recipient, created in the last 24 h",
            {"recipient": "user7@example.com", "since": now - timedelta(days=1)},
        ),
        (
            "created 10 to 9 days ago",
            {"since": now - timedelta(days=10), "until": now - timedelta(days=9)},
        ),
        ("recipient, no time range", {"recipient": "user7@example.com"}),
    ]
    print(f"{'query':<42} {'median ms':>10} {'rows':>5}  plan")
    for name, f in cases:
        times, rows = [], 0
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            with engine.begin() as conn:
                params: dict[str, Any] = {**f, "limit": listing.PAGE + 1}
                if "since" in f:
                    params["min_id"] = listing.id_at(conn, f["since"])
                if "until" in f:
                    params["max_id"] = listing.id_after(conn, f["until"])
                try:
                    rows = len(listing.list_rows(conn, params))
                except Exception as exc:  # the console's statement timeout
                    rows = -1
                    print(f"  {name}: {str(exc).splitlines()[0]}")
                    break
            times.append((time.perf_counter() - t0) * 1000)
        with engine.connect() as conn:
            plan = listing.explain_list(conn, params).splitlines()
        scan = next((p.strip() for p in plan if "Scan" in p), plan[0].strip())
        print(f"{name:<42} {statistics.median(times):>10.1f} {rows:>5}  {scan[:70]}")
    engine.dispose()
    if not args.keep:
        drop_databases([DATABASE])


if __name__ == "__main__":
    main()
