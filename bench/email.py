"""Email sends: (a) through an SMTP relay on loopback that answers each message after 50 ms.

What it measures
    (a) ``--count`` rows (default 20,000) on the ``email`` channel, sent by a worker with
    ``--concurrency=2`` and notifier's DEFAULT settings (no ``NOTIFIER_*`` but the URLs, the
    relay's host and port and a sender address), through a local ESMTP relay (an asyncio
    protocol in a process of its own: ``bench/smtp_relay.py``) that offers
    PIPELINING, answers each message's final dot after 50 ms and answers 421 to any connection
    past 100 open at once. Emails per second, from the INSERT's commit to the last row
    recorded (a row retried counts when it is finally sent), and the time a million would take.
    The relay keeps the ``Message-ID`` of every message it accepted; each names its row, so
    the rows the table says were sent are compared with what the relay received: none lost
    (sent in the table, never received), none received twice.

    (b) the same count of a campaign's emails (one body, one address a row) through each email
    API provider, ``sendgrid``, ``mailgun`` and ``postmark``, chosen with
    ``NOTIFIER_FAILOVER=email=<provider>`` and otherwise notifier's defaults, against a loopback
    server of the provider's published format (``tests/esp_servers.py``: it checks every
    request against the format and answers each after 200 ms) in a thread of this process;
    twice each: without a limit, and with the server answering 429 (``Retry-After: 1``) to a
    request that would take it past ``--api-limit`` messages a second (default 2,000) and
    notifier's ``NOTIFIER_RATE_LIMITS=email=<that>/s``. Emails per second, the share of the
    limit used, the 429s the server answered, and the messages it took compared with the rows
    sent: none lost, none twice.

Targets
    (a) at least 1,500 emails/s; (b) at least 5,000 emails/s through each API without a limit,
    and at least 95 % of the limit with it, with no more than a handful of 429s (10); nothing
    lost or duplicated in any run. The exit status is 0 whether the
    target is met or not; 1 if the set-up fails or PostgreSQL or Redis goes away; 130 when
    interrupted.

How to run it
    From the repository root, with PostgreSQL and Redis on localhost::

        python bench/email.py [--count N] [--api-limit N] [--concurrency N]
                              [--set NAME=VALUE] [--keep]

    Its databases ``notifier_bench_email_<smtp|provider>_<pid>``; a Redis server of its own on a
    free loopback port (or the database ``NOTIFIER_BENCH_REDIS`` names, flushed before each drain
    and at the end).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

# This file is named like the standard library's ``email``: its folder must not come first on
# the path, or every ``import email`` (smtplib, notifier) would import it.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))  # notifier and bench

from bench import harness
from bench.common import Conn
from bench.drains import drain, workers
from bench.harness import Bench, Line, fmt_int
from bench.smtp_relay import RelayCounts, SmtpRelay
from notifier.settings import Settings
from tests import esp_servers  # # the providers' formats, as the tests check them

#: The relay's answer time per message, and the connections it takes at once.
RELAY_DELAY = 0.05
RELAY_CONNECTIONS = 100
SMTP_TARGET = 1500.0
RECIPIENT = "reader@example.com"

NAMES = ("count", "api_limit", "ses_limit", "concurrency", "set", "keep")


def smtp_relay(bench: Bench) -> None:
    """(a): the SMTP relay on loopback."""
    rows = bench.args.count
    print(
        f"\na. SMTP: {rows:,} emails to a relay answering each after {RELAY_DELAY * 1000:.0f} ms,"
        f" PIPELINING offered, at most {RELAY_CONNECTIONS} connections"
    )
    name, url = bench.database("email_smtp")
    relay = SmtpRelay(RELAY_DELAY, RELAY_CONNECTIONS).start()
    counts: RelayCounts | None = None
    try:
        settings = {
            "smtp_host": "127.0.0.1",
            "smtp_port": str(relay.port),
            "email_from": "bench@notifier.example",
        }
        pool = bench.args.concurrency
        with workers(bench, "email-smtp", name, url, settings, pool) as (services, conn):
            relay_cpu = relay.cpu_seconds
            d = drain(conn, name, services, rows, "email", RECIPIENT, 60 + rows / 50)
            relay_cpu = relay.cpu_seconds - relay_cpu
            sent_ids = _sent_ids(conn)
    finally:
        counts = relay.stop()
    bench.done_with(name)
    million = 1_000_000 / d.rate if d.rate > 0 else float("inf")
    print(
        f"  {d.sent:,} sent in {d.seconds:.2f}s = {fmt_int(d.rate)}/s; a million would take"
        f" {_duration(million)}; CPU: worker {d.worker_cpu:.1f}s, PostgreSQL"
        f" {d.postgres_cpu:.1f}s, relay {relay_cpu:.1f}s; load average {d.load}",
        flush=True,
    )
    print(f"    first batch {d.first_batch:.2f}s after the commit; {d.describe()}")
    if d.retried:
        print(f"    {d.retried} rows needed more than one attempt (see last_error)")
    if d.sent != rows:
        print(f"    NOT ALL SENT: {d.by_status}{' (timed out)' if d.timed_out else ''}")
    exact = False
    if counts is None:
        print("    the relay did not say what it received")
    else:
        lost, twice = _compare(sent_ids, counts.row_ids)
        exact = not lost and not twice and len(counts.row_ids) == len(sent_ids)
        print(
            f"    the relay received {len(counts.row_ids):,} messages for {len(sent_ids):,} sent"
            f" rows: {len(lost)} lost, {len(twice)} received more than once; connections:"
            f" {counts.connections:,} opened, at most {counts.peak} at once, {counts.refused}"
            " refused"
        )
    ok = d.rate >= SMTP_TARGET and d.sent == rows and exact
    bench.lines.append(
        Line(
            "a SMTP relay, 50 ms a message",
            f"{fmt_int(d.rate)} emails/s",
            f">= {fmt_int(SMTP_TARGET)}/s",
            "PASS" if ok else "FAIL",
        )
    )
    bench.settings_used.append(
        f"(a) defaults but NOTIFIER_SMTP_HOST=127.0.0.1, NOTIFIER_SMTP_PORT=<relay>,"
        f" NOTIFIER_EMAIL_FROM=bench@notifier.example; --concurrency={pool}"
    )


#: The API servers' answer time per request, and what (b) asks of them.
API_DELAY = 0.2
API_TARGET = 5000.0
API_SHARE = 0.95
API_MOST_429 = 10
API_BODY = "Your code: see your account. Use it at checkout before Sunday."
#: Where each provider's server puts the row's id among a message's metadata.
ROW_KEY = {
    "sendgrid": "notifier_id",
    "mailgun": "notifier_id",
    "postmark": "notifier-id",
    "ses": "notifier_id",
}
#: The APIs that take many recipients a request, which the 5,000/s target is for. SES's
#: ``SendEmail`` takes one message: it is measured against what its sends in flight allow.
BATCHED = ("sendgrid", "mailgun", "postmark")
#: The AWS SDK's credentials for the SES server, which checks their form, not their value.
AWS_ENV = {"AWS_ACCESS_KEY_ID": "AKIDBENCHMARK", "AWS_SECRET_ACCESS_KEY": "bench-secret"}


def email_apis(bench: Bench) -> None:
    """(b): each email API provider, without a limit and with one."""
    for kind in ROW_KEY:
        limited = bench.args.api_limit if kind in BATCHED else bench.args.ses_limit
        for limit in (None, float(limited)):
            _email_api(bench, kind, limit)
    bench.settings_used.append(
        "(b) defaults but NOTIFIER_FAILOVER=email=<provider>, the provider's key and API base"
        " (http://127.0.0.1:<port>; SES: NOTIFIER_SES_ENDPOINT_URL, NOTIFIER_SES_REGION and"
        " AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY), NOTIFIER_EMAIL_FROM=bench@notifier.example;"
        f" with the limit, NOTIFIER_RATE_LIMITS=email={bench.args.api_limit}/s (SES:"
        f" {bench.args.ses_limit}/s); --concurrency={bench.args.concurrency}"
    )


def _ses_ceiling(bench: Bench) -> float:
    """What SES's one message a request allows: every process's sends in flight, each
    answered after ``API_DELAY``."""
    default = Settings.model_fields["async_send_concurrency"].default
    in_flight = int(bench.args.set.get("async_send_concurrency", default))
    return float(bench.args.concurrency * in_flight / API_DELAY)


def _email_api(bench: Bench, kind: str, limit: float | None) -> None:
    rows = bench.args.count
    limited = f", limited to {limit:,.0f}/s" if limit else ""
    print(f"\nb. {kind}: {rows:,} campaign emails, {API_DELAY * 1000:.0f} ms a request{limited}")
    name, url = bench.database(f"email_{kind}")
    with esp_servers.running(kind) as server:
        server.delay, server.limit = API_DELAY, limit
        settings = {
            "failover": f"email={kind}",
            "email_from": "bench@notifier.example",
            **_credentials(kind, server.url),
        }
        if limit:
            settings["rate_limits"] = f"email={limit:.0f}/s"
        pool = bench.args.concurrency
        aws = AWS_ENV if kind == "ses" else None
        with workers(bench, f"email-{kind}", name, url, settings, pool, aws) as (services, conn):
            d = drain(
                conn, name, services, rows, "email", "u{n}@example.com", 60 + rows / 50,
                body=API_BODY,
            )  # fmt: skip
            sent_ids = _sent_ids(conn)
        taken = [int(m["metadata"][ROW_KEY[kind]]) for m in server.taken]
        requests, throttled, violations = len(server.requests), server.throttled, server.violations
    bench.done_with(name)
    lost, twice = _compare(sent_ids, taken)
    exact = not lost and not twice and len(taken) == len(sent_ids) == rows
    million = 1_000_000 / d.rate if d.rate > 0 else float("inf")
    share = f"; {d.rate / limit:.0%} of the limit" if limit else ""
    print(
        f"  {d.sent:,} sent in {d.seconds:.2f}s = {fmt_int(d.rate)}/s{share}; a million would"
        f" take {_duration(million)}; {requests:,} requests, {throttled} answered 429;"
        f" CPU: worker {d.worker_cpu:.1f}s, PostgreSQL {d.postgres_cpu:.1f}s; load {d.load}",
        flush=True,
    )
    print(
        f"    the server took {len(taken):,} messages for {len(sent_ids):,} sent rows:"
        f" {len(lost)} lost, {len(twice)} received more than once; {d.describe()}"
    )
    if violations:
        print(f"    REQUESTS OFF THE FORMAT: {len(violations)}, e.g. {violations[0]}")
    if d.sent != rows:
        print(f"    NOT ALL SENT: {d.by_status}{' (timed out)' if d.timed_out else ''}")
    if limit:
        ok = d.rate >= API_SHARE * limit and throttled <= API_MOST_429
        figure, target = f"{d.rate / limit:.0%} of {limit:,.0f}/s", f">= {API_SHARE:.0%}"
    elif kind in BATCHED:
        ok = d.rate >= API_TARGET
        figure, target = f"{fmt_int(d.rate)} emails/s", f">= {fmt_int(API_TARGET)}/s"
    else:  # one message a request: no target but what its sends in flight allow
        ceiling = _ses_ceiling(bench)
        ok = True
        figure = f"{fmt_int(d.rate)} emails/s, {d.rate / ceiling:.0%} of {fmt_int(ceiling)}/s"
        target = "(none)"
    bench.lines.append(
        Line(
            f"b {kind}, 200 ms a request{' at its limit' if limit else ''}",
            figure + (f", {throttled} 429s" if limit else ""),
            target,
            "PASS" if ok and exact and not violations else "FAIL",
        )
    )


def _credentials(kind: str, url: str) -> dict[str, str]:
    """The settings that point ``kind`` at the server at ``url``, with its credentials."""
    if kind == "ses":
        return {"ses_endpoint_url": url, "ses_region": "us-east-1"}
    if kind == "sendgrid":
        return {"sendgrid_api_base": url, "sendgrid_api_key": esp_servers.SENDGRID_KEY}
    if kind == "mailgun":
        return {
            "mailgun_api_base": url,
            "mailgun_api_key": esp_servers.MAILGUN_KEY,
            "mailgun_domain": esp_servers.MAILGUN_DOMAIN,
        }
    return {"postmark_api_base": url, "postmark_server_token": esp_servers.POSTMARK_TOKEN}


#: One function per target, run in order.
TARGETS = [smtp_relay, email_apis]


def _sent_ids(conn: Conn) -> list[int]:
    rows = conn.execute("SELECT id FROM notifications WHERE status = 'sent'").fetchall()
    return [int(r[0]) for r in rows]


def _compare(sent: list[int], received: list[int]) -> tuple[set[int], set[int]]:
    """Rows sent but never received, and rows received more than once."""
    seen = Counter(received)
    return set(sent) - set(seen), {i for i, n in seen.items() if n > 1}


def _duration(seconds: float) -> str:
    if not seconds < float("inf"):
        return "-"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def main(argv: list[str] | None = None) -> int:
    return harness.main(__doc__, "email throughput", harness.REDIS, NAMES, TARGETS, argv)


if __name__ == "__main__":
    sys.exit(main())
