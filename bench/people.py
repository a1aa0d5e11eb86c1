"""A campaign to people against the same campaign to plain addresses: what profiles,
preferences, quiet hours and frequency caps cost, and proof that they held.

What it measures
    Two runs on one machine, each in a scratch database of its own, one after the other:

    a. **Addresses**: a campaign ``spring`` to ``--rows-campaign`` recipients (default
       1,000,000), and a campaign ``autumn`` to a tenth of them, both on ``email`` with one
       text for everyone (each row's code in its payload), through a SendGrid-format server on
       loopback answering each request after 200 ms (``tests/esp_servers.py``),
       ``NOTIFIER_FREQUENCY_CAPS=marketing=1/d``.
    b. **Profiles**: the same people as profiles spread evenly across 24 time zones (one per
       UTC offset from -11 to +12), a twentieth of them with ``marketing`` turned off by email,
       the same two campaigns with ``--audience profiles``, the same caps, and
       ``NOTIFIER_QUIET_HOURS=marketing=22:00-07:00`` (in each person's zone: at any moment
       about 9 of the 24 zones are inside it).

    Each run: the audience and codes imported, then both launches timed, then a worker
    (``--concurrency``, default 2) and beat started, and the time from their start to the
    last row decided (sent, held back by quiet hours, or cancelled by a preference or the cap)
    measured; rows a second is rows decided over that time. Then the database is asked whether
    any row was sent inside its person's quiet hours (its ``sent_at`` in the person's zone),
    whether any person got more than one ``marketing`` message, and whether any row is left
    undecided.

Targets
    The profiles' drain at least 0.8 of the addresses' in rows decided a second; no row sent
    inside quiet hours; no person over the cap; every row decided. The exit status is 0
    whether the targets are met or not; 1 if the set-up fails; 130 when interrupted.

How to run it
    From the repository root, with PostgreSQL and Redis on localhost::

        python bench/people.py [--rows-campaign N] [--concurrency N] [--set NAME=VALUE] [--keep]

    Its databases ``notifier_bench_people_<addresses|profiles>_<pid>``; a Redis server of its
    own (or the database ``NOTIFIER_BENCH_REDIS`` names, flushed before each run).
"""

from __future__ import annotations

import io
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))  # notifier and bench

import psycopg

from bench import harness
from bench.common import Conn, sqlalchemy_url
from bench.drains import workers
from bench.harness import Bench, Line, fmt_int
from notifier.campaigns import Campaigns
from notifier.db import make_engine
from tests import esp_servers  # the providers' formats, as the tests check them

API_DELAY = 0.2
#: One text for everyone, as a promo's announcement (the code is in each row's payload): rows
#: of one text share a request, so what is measured is the people, not one request per row.
SUBJECT = "Our spring offer"
BODY = "Your code is waiting in your account. Use it at checkout before Sunday."
SHARE = 0.8
QUIET = ("22:00", "07:00")
#: One zone per UTC offset, -11 to +12 (POSIX names: Etc/GMT+11 is UTC-11), without DST.
ZONES = [f"Etc/GMT{'+' if h < 0 else '-'}{abs(h)}" if h else "UTC" for h in range(-11, 13)]
NAMES = ("rows_campaign", "concurrency", "set", "keep")


def _settings(server_url: str, people: bool) -> dict[str, str]:
    settings = {
        "failover": "email=sendgrid",
        "email_from": "bench@notifier.example",
        "sendgrid_api_base": server_url,
        "sendgrid_api_key": esp_servers.SENDGRID_KEY,
        "frequency_caps": "marketing=1/d",
    }
    if people:
        settings["quiet_hours"] = f"marketing={QUIET[0]}-{QUIET[1]}"
    return settings


def _audience(conn: Conn, n: int, people: bool) -> None:
    """The people: profiles across the zones (and a twentieth opted out), or nothing to make
    for plain addresses."""
    if not people:
        return
    conn.execute(
        "INSERT INTO profiles (id, email, time_zone, fields)"
        " SELECT 'p' || g, 'u' || g || '@example.com', (%s::text[])[1 + g %% 24],"
        "        jsonb_build_object('name', 'Reader ' || g)"
        "   FROM generate_series(1, %s) AS g",
        (ZONES, n),
    )
    conn.execute(
        "INSERT INTO preferences (profile, category, channel, enabled, source)"
        " SELECT 'p' || g, 'marketing', 'email', false, 'person'"
        "   FROM generate_series(20, %s, 20) AS g",
        (n,),
    )
    conn.execute("ANALYZE profiles, preferences")


def _csv(n: int, step: int, people: bool) -> io.StringIO:
    rows = (f"p{g},Reader {g}" if people else f"u{g}@example.com,Reader {g}"
            for g in range(1, n + 1, step))  # fmt: skip
    return io.StringIO("recipient,name\n" + "\n".join(rows) + "\n")


def run(bench: Bench, people: bool) -> None:
    """One run (see the module docstring)."""
    kind = "profiles" if people else "addresses"
    n = bench.args.rows_campaign
    print(f"\n{'b' if people else 'a'}. {kind}: {n:,} people, and a tenth of them twice")
    name, url = bench.database(f"people_{kind}")
    engine = make_engine(sqlalchemy_url(url))
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as setup:
            _audience(setup, n, people)
        campaigns = Campaigns(engine)
        audience = "profiles" if people else "addresses"
        started = time.monotonic()
        for campaign, step in (("spring", 1), ("autumn", 10)):
            campaigns.create(campaign, "email", subject=SUBJECT, body=BODY,
                             audience=audience)  # fmt: skip
            campaigns.import_audience(campaign, _csv(n, step, people))
            campaigns.generate_codes(campaign, (n + step - 1) // step)
        imported = time.monotonic() - started
        started = time.monotonic()
        rows = sum(campaigns.launch(c) for c in ("spring", "autumn"))
        launched = time.monotonic() - started
        print(f"  imported in {imported:.1f}s; {rows:,} rows launched in {launched:.1f}s",
              flush=True)  # fmt: skip
        with esp_servers.running("sendgrid") as server:
            server.delay = API_DELAY
            settings = _settings(server.url, people)
            pool = bench.args.concurrency
            with workers(bench, f"people-{kind}", name, url, settings, pool) as (_, conn):
                timed_out = not _wait(conn, 120 + rows / 200)
                first, last = conn.execute(
                    "SELECT extract(epoch FROM min(updated_at)), extract(epoch FROM"
                    " max(updated_at)) FROM notifications"
                ).fetchone() or (0, 0)
                statuses = _statuses(conn)
                broken = _broken(conn) if people else []
    finally:
        engine.dispose()
    bench.done_with(name)
    seconds = float(last) - float(first)
    rate = rows / seconds if seconds > 0 else float("nan")
    print(f"  {rows:,} rows decided in {seconds:.1f}s = {fmt_int(rate)}/s"
          f"{' (TIMED OUT)' if timed_out else ''}: {statuses}")  # fmt: skip
    bench.found[kind] = harness.Result(rows, seconds)
    bench.lines.append(Line(f"{kind[0]} launch, {kind}", f"{launched:.1f}s for {rows:,} rows"))
    if not people:
        bench.lines.append(Line("a drain, addresses", f"{fmt_int(rate)} rows/s"))
        return
    base = bench.found["addresses"].rate if "addresses" in bench.found else float("nan")
    share = rate / base
    bench.lines.append(
        Line(
            "b drain, profiles",
            f"{fmt_int(rate)} rows/s = {share:.2f} of addresses",
            f">= {SHARE}",
            "PASS" if share >= SHARE else "FAIL",
        )
    )
    for check in broken:
        print(f"    {check}")
    undecided = statuses.get("processing", 0) + statuses.get("pending", 0)
    bench.lines.append(
        Line(
            "b sent in quiet hours, over the cap, undecided",
            f"{len(broken)} checks failed, {undecided} undecided",
            "0, 0",
            "PASS" if not broken and not undecided and not timed_out else "FAIL",
        )
    )


def _wait(conn: Conn, timeout: float) -> bool:
    """Until no row is processing or due (held rows wait for later); False on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = conn.execute(
            "SELECT count(*) FROM notifications WHERE status = 'processing'"
            " OR (status = 'pending' AND next_attempt_at <= now())"
        ).fetchone()
        if left is not None and left[0] == 0:
            return True
        time.sleep(0.5)
    return False


def _statuses(conn: Conn) -> dict[str, int]:
    rows = conn.execute(
        "SELECT CASE WHEN status = 'pending' AND last_error LIKE 'quiet hours%%'"
        " THEN 'held (quiet hours)' ELSE status END, count(*) FROM notifications GROUP BY 1"
    ).fetchall()
    return {str(k): int(v) for k, v in rows}


def _broken(conn: Conn) -> list[str]:
    """What the database shows against the promises: each a line, none when all held."""
    found = []
    start, end = QUIET
    inside = conn.execute(
        "SELECT count(*) FROM notifications n JOIN profiles p ON p.id = n.profile"
        " WHERE n.status = 'sent' AND ((n.sent_at AT TIME ZONE p.time_zone)::time >= %s::time"
        "  OR (n.sent_at AT TIME ZONE p.time_zone)::time < %s::time)",
        (start, end),
    ).fetchone()
    if inside and inside[0]:
        found.append(f"{inside[0]} rows sent inside their person's quiet hours")
    over = conn.execute(
        "SELECT count(*) FROM (SELECT profile FROM notifications WHERE status = 'sent'"
        " AND category = 'marketing' GROUP BY profile HAVING count(*) > 1) AS o"
    ).fetchone()
    if over and over[0]:
        found.append(f"{over[0]} people got more than one marketing message")
    opted = conn.execute(
        "SELECT count(*) FROM notifications n JOIN preferences p ON p.profile = n.profile"
        " AND p.category = 'marketing' AND NOT p.enabled WHERE n.status = 'sent'"
    ).fetchone()
    if opted and opted[0]:
        found.append(f"{opted[0]} rows sent to people who turned marketing off")
    return found


def addresses(bench: Bench) -> None:
    run(bench, people=False)


def people(bench: Bench) -> None:
    run(bench, people=True)
    bench.settings_used.append(
        "(a), (b) defaults but NOTIFIER_FAILOVER=email=sendgrid, its key and API base"
        " (http://127.0.0.1:<port>, 200 ms a request), NOTIFIER_EMAIL_FROM,"
        " NOTIFIER_FREQUENCY_CAPS=marketing=1/d; (b) also NOTIFIER_QUIET_HOURS="
        f"marketing={QUIET[0]}-{QUIET[1]}; --concurrency={bench.args.concurrency}"
    )


TARGETS = [addresses, people]


def main(argv: list[str] | None = None) -> int:
    return harness.main(__doc__, "people", harness.REDIS, NAMES, TARGETS, argv)


if __name__ == "__main__":
    sys.exit(main())
