"""The HTTP API under load: single requests, batches against COPY, and the drain beside it.

What it measures
    ``notifier api --workers 2`` (default settings) on loopback, each measurement in a scratch
    database of its own:

    a. **Single requests**: ``--requests`` (default 20,000) ``POST /v1/notifications``, each
       with an Idempotency-Key (as the SDK sends them), from 50 concurrent clients (asyncio and
       httpx, in this process): requests a second, and the latency's p50 and p99.
    b. **Batches**: ``--batches`` (default 20) ``POST /v1/notifications/batch`` of 1,000 items
       each (each item with its idempotency key), one request after the other, and the same
       number of items again through the SDK's ``notify_many`` (1,000 a request, four under
       way): rows a second, against COPY of as many rows into ``notifications`` (psycopg, one
       connection, 1,000 rows a transaction) in the same run. The SDK's run and COPY's are
       alternated three times, and the target is judged on the median of the three pairs'
       ratios: one run takes about a second, and moves more than a change to be judged. Both
       are warmed first, unmeasured (``WARM_UP`` items through the SDK, as many rows by COPY
       on the connection that then COPYs the measured rows): the API's pools grow to the
       SDK's requests under way, and each server process reads the table's definitions at its
       first statements, as a running service and a loader have done.
    c. **The drains beside it**: a worker (2 processes, default settings) drains ``--rows``
       rows of each of two kinds, once alone, once while 50 clients write single requests at a
       steady 200 a second, and once while they write as fast as the API answers (rows due a
       day later, so the drain's own rows are what it drains): each loaded drain's rate over
       the same kind's alone. The kinds: ``webhook`` rows to a receiver on loopback that
       answers after 50 ms (``bench/servers.py``, as ``bench/webhook.py`` uses), a provider's
       latency, where the people notified feel a drain; and ``null`` rows, which cost the
       worker nothing but its CPU and PostgreSQL's. The target is judged on the webhooks at
       the steady load; the null rows' figures are printed beside it: on a machine where the
       API, its clients, the worker and PostgreSQL share two cores, every core-second the API
       takes is one a CPU-bound drain loses.

       Then the control: the webhook drain once more, beside a load that takes the same cores
       as the steady load did (the API's, its clients', and PostgreSQL's beyond the drain's
       own, read during the steady webhook drain) and does nothing else (``bench/burner.py``:
       processes that spin). The steady figure over the control's says what the API costs the
       drain beyond the cores it takes; the control alone, what a load of that size costs the
       drain on this machine, whatever serves it.

    The load comes from this process, on the same machine as the API, PostgreSQL and Redis:
    every figure is what the machine as a whole can do, the client's CPU included.

Targets
    Batches at least 0.3 of COPY in rows a second; the webhook drain under the steady load at
    least 0.9 of the same drain alone (the issue sets no figure for single requests: they are
    reported). The exit status is 0 whether the targets are met or not; 1 if the set-up fails.

How to run it
    From the repository root, with PostgreSQL and Redis on localhost::

        python bench/api.py [--requests N] [--batches N] [--rows N] [--keep]
"""

from __future__ import annotations

import asyncio
import math
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))  # notifier and bench

import aiohttp
import httpx
import psycopg

from bench import harness
from bench.burner import Burner
from bench.common import (
    REPO,
    Conn,
    CpuMeter,
    Services,
    SetupError,
    backend_pids,
    free_port,
    process_tree,
    service_env,
    wait_until,
)
from bench.drains import highest_id, insert_due, workers
from bench.harness import Bench, Line, fmt_int
from bench.servers import WebhookServer
from notifier import sdk
from notifier.api import keys
from notifier.db import api as api_db
from notifier.db import make_engine

API_PROCESSES = 2
CLIENTS = 50
BATCH = 1_000
COPY_TARGET = 0.3
DRAIN_TARGET = 0.9
#: The steady load the drain is measured beside: a service's notifications, not a flood. The
#: API saturated by clients on the same two cores takes the CPU the drain needs; that figure is
#: printed too, and says what this machine can do, not what the API does to the drain.
STEADY = 200
CLIENTS_PART = "this process (the clients)"
#: The drains' provider: a webhook receiver on loopback answering after this long, as a real
#: endpoint does (bench/webhook.py's), which the worker is allowed to send to.
WEBHOOK_DELAY = 0.05
LOOPBACK_WEBHOOKS = {
    "webhook_allow_http": "true",
    "webhook_allowed_networks": "127.0.0.0/8,::1/128",
}
NAMES = ("rows", "keep")


def _options(argv: list[str] | None) -> None:
    """--requests and --batches, this script's own (harness.OPTIONS has the rest)."""
    harness.OPTIONS.setdefault(
        "requests",
        (("--requests",), {"type": harness.positive, "default": 20_000, "help": "single requests"}),
    )
    harness.OPTIONS.setdefault(
        "batches",
        (("--batches",), {"type": harness.positive, "default": 20, "help": "batches of 1,000"}),
    )


def _key(url: str) -> str:
    made = keys.make("bench", per_second=1_000_000)  # the load measures the API, not its limit
    engine = make_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.begin() as conn:
            api_db.create_key(conn, made.row)
    finally:
        engine.dispose()
    return made.key


@contextmanager
def api_server(bench: Bench, url: str, tag: str) -> Iterator[tuple[str, int]]:
    """``notifier api --workers 2`` on database ``url``, ready; its base URL and its pid."""
    port = free_port()
    workdir = bench.workdir / f"api-{tag}"
    workdir.mkdir()
    env = service_env(url, bench.redis, workdir, {})
    log = (workdir / "api.log").open("wb")
    argv = [
        str(Path(sys.executable).with_name("notifier")),
        "api",
        "--host=127.0.0.1",
        f"--port={port}",
        f"--workers={API_PROCESSES}",
    ]
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _ready(base, proc), 60, "notifier api")
        yield base, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _ready(base: str, proc: subprocess.Popen[bytes]) -> bool:
    if proc.poll() is not None:
        raise SetupError(f"notifier api exited with status {proc.returncode}")
    try:
        return httpx.get(base + "/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _one(i: int, due_in: float | None = None) -> dict[str, object]:
    doc: dict[str, object] = {"channel": "null", "to": f"u{i}@example.com", "body": "hello"}
    if due_in is not None:
        doc["delay_seconds"] = due_in
    return doc


async def _clients(
    base: str,
    key: str,
    requests: int | None,
    stop: threading.Event | None,
    due_in: float | None,
    rate: float | None = None,
) -> tuple[list[float], float, int]:
    """50 clients sending single requests until ``requests`` are sent (or ``stop`` is set), at
    most ``rate`` a second together when given: each request's seconds, the wall time, and the
    answers that were not 201. On aiohttp: an httpx client spent 4.7 ms of this machine's CPU
    a request, more than the API it measured."""
    latencies: list[float] = []
    failed = 0
    sent = 0
    headers = {"Authorization": f"Bearer {key}"}
    connector = aiohttp.TCPConnector(limit=CLIENTS)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(
        base, headers=headers, connector=connector, timeout=timeout
    ) as session:

        async def client() -> None:
            nonlocal sent, failed
            while (requests is None or sent < requests) and not (stop and stop.is_set()):
                sent += 1
                if rate is not None:  # the n-th request starts n / rate seconds in
                    await asyncio.sleep(max(0.0, begun + sent / rate - time.perf_counter()))
                started = time.perf_counter()
                async with session.post(
                    "/v1/notifications",
                    json=_one(sent, due_in),
                    headers={"Idempotency-Key": str(uuid.uuid4())},
                ) as answer:
                    await answer.read()
                    failed += answer.status != 201
                latencies.append(time.perf_counter() - started)

        started = begun = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(CLIENTS)))
        return latencies, time.perf_counter() - started, failed


def single(bench: Bench) -> None:
    n = bench.args.requests
    print(f"\na. single requests: {n:,} from {CLIENTS} clients")
    name, url = bench.database("api_single")
    key = _key(url)
    with api_server(bench, url, "single") as (base, _):
        asyncio.run(_clients(base, key, 500, None, None))  # warm-up: connections, pools
        latencies, wall, failed = asyncio.run(_clients(base, key, n, None, None))
    bench.done_with(name)
    latencies.sort()
    p50 = statistics.median(latencies) * 1000
    p99 = latencies[int(len(latencies) * 0.99) - 1] * 1000
    rate = len(latencies) / wall
    print(f"  {len(latencies):,} requests in {wall:.1f}s, {failed} not 201")
    bench.lines.append(
        Line("a single requests", f"{fmt_int(rate)}/s, p50 {p50:.1f} ms, p99 {p99:.1f} ms")
    )


#: The SDK's run and COPY's, alternated this many times: one run of 20,000 items takes about a
#: second, and moves more between runs than the changes it is used to judge.
PAIRS = 3
#: Items the SDK writes, and rows COPY writes, before the pairs are measured.
WARM_UP = 8 * BATCH


COPY_ROWS = "COPY notifications (channel, recipient, body, dedupe_key) FROM STDIN"


def _copy(conn: Conn, batches: int, tag: str) -> float:
    """Seconds to COPY ``batches`` of ``BATCH`` rows into ``notifications``, a transaction each."""
    started = time.perf_counter()
    for b in range(batches):
        with conn.cursor() as cur, cur.copy(COPY_ROWS) as copy:
            for i in range(BATCH):
                n = b * BATCH + i
                copy.write_row(("null", f"c{n}@example.com", "hello", f"c:{tag}:{n}"))
        conn.commit()
    return time.perf_counter() - started


def bulk(bench: Bench) -> None:
    batches = bench.args.batches
    print(f"\nb. batches: {batches} of {BATCH:,}, against COPY ({PAIRS} runs of each, alternated)")
    name, url = bench.database("api_bulk")
    key = _key(url)
    rows = batches * BATCH
    sdk_walls: list[float] = []
    copy_walls: list[float] = []
    with (
        api_server(bench, url, "bulk") as (base, _),
        httpx.Client(base_url=base, timeout=120) as c,
    ):
        started = time.perf_counter()
        failed = 0
        for b in range(batches):  # one request at a time
            items = [{**_one(b * BATCH + i), "idempotency_key": f"{b}:{i}"} for i in range(BATCH)]
            answer = c.post(
                "/v1/notifications/batch",
                json={"notifications": items},
                headers={"Authorization": f"Bearer {key}"},
            )
            results = answer.json()["results"]
            failed += sum(1 for r in results if r["status"] != "created")
        one_wall = time.perf_counter() - started
        with (
            sdk.Client(base, key, timeout=120) as api,  # as the SDK sends them: IN_FLIGHT at once
            psycopg.connect(url, autocommit=False) as copier,
        ):
            # Both warmed first, not measured: the API's pools grow to the SDK's requests under
            # way, and a server process reads the table's definitions (triggers, indexes,
            # policies) at its first statements; a running service and a loader have done that.
            warm = [{**_one(i), "idempotency_key": f"warm:{i}"} for i in range(WARM_UP)]
            failed += sum(1 for r in api.notify_many(warm) if r.status != "created")
            _copy(copier, WARM_UP // BATCH, "warm")
            for run in range(PAIRS):
                first = (run + 1) * rows
                items = [
                    {**_one(first + i), "idempotency_key": f"sdk:{run}:{i}"} for i in range(rows)
                ]
                started = time.perf_counter()
                results = api.notify_many(items)
                sdk_walls.append(time.perf_counter() - started)
                failed += sum(1 for r in results if r.status != "created")
                copy_walls.append(_copy(copier, batches, str(run)))
    bench.done_with(name)
    shares = [copy / made for copy, made in zip(copy_walls, sdk_walls, strict=True)]
    share = statistics.median(shares)
    copy_rate = rows / statistics.median(copy_walls)
    print(
        f"  API {rows:,} rows one request at a time in {one_wall:.1f}s ({failed} not created);"
        f" the SDK in {', '.join(f'{w:.2f}' for w in sdk_walls)}s, COPY in"
        f" {', '.join(f'{w:.2f}' for w in copy_walls)}s: {', '.join(f'{x:.2f}' for x in shares)}"
        " of COPY pair by pair"
    )
    bench.lines.append(Line("b COPY, 1,000 rows a transaction", f"{fmt_int(copy_rate)} rows/s"))
    bench.lines.append(
        Line(
            "b batches of 1,000, one request at a time",
            f"{fmt_int(rows / one_wall)} rows/s = {rows / one_wall / copy_rate:.2f} of COPY",
        )
    )
    bench.lines.append(
        Line(
            f"b the SDK's notify_many ({sdk.IN_FLIGHT} requests under way)",
            f"{fmt_int(rows / statistics.median(sdk_walls))} rows/s = {share:.2f} of COPY"
            f" (the median of {PAIRS} pairs)",
            f">= {COPY_TARGET}",
            "PASS" if share >= COPY_TARGET else "FAIL",
        )
    )


def beside(bench: Bench) -> None:
    rows = bench.args.rows
    print(
        f"\nc. drains of {rows:,} rows, alone and beside {CLIENTS} API clients: null rows, and"
        f" webhooks to a receiver answering after {WEBHOOK_DELAY * 1000:.0f} ms"
    )
    name, url = bench.database("api_drain")
    key = _key(url)
    server = WebhookServer(WEBHOOK_DELAY).start()
    kinds = {"null": ("null", "{tag}{{n}}@example.com"), "webhook": ("webhook", "")}
    kinds["webhook"] = ("webhook", server.url + "/{tag}{{n}}")
    drains: dict[tuple[str, str], float] = {}
    used: dict[tuple[str, str], dict[str, float]] = {}  # each drain's cores, by part
    try:
        with workers(bench, "api-drain", name, url, LOOPBACK_WEBHOOKS) as (services, conn):
            worker = services.pid("worker")
            parts: dict[str, Callable[[], list[int]]] = {
                "worker": lambda: process_tree(worker),
                "PostgreSQL": lambda: backend_pids(conn, name),
                "receiver": lambda: (
                    [server.process.pid] if server.process and server.process.pid else []
                ),
                CLIENTS_PART: lambda: [os.getpid()],
            }
            for kind, (channel, recipient) in kinds.items():
                drains[kind, "alone"], used[kind, "alone"] = _drain(
                    conn, services, rows, channel, recipient, "alone", parts
                )
            with api_server(bench, url, "drain") as (base, api):
                parts["API"] = lambda: process_tree(api)
                for tag, rate in (("steady", STEADY), ("saturated", None)):
                    stop = threading.Event()
                    load = threading.Thread(
                        target=asyncio.run, args=(_clients(base, key, None, stop, 86_400.0, rate),)
                    )
                    load.start()
                    time.sleep(2)  # the load is on before the rows are
                    try:
                        for kind, (channel, recipient) in kinds.items():
                            drains[kind, tag], used[kind, tag] = _drain(
                                conn, services, rows, channel, recipient, tag, parts
                            )
                    finally:
                        stop.set()
                        load.join(60)
            del parts["API"]
            taken = _load_cores(used["webhook", "steady"], used["webhook", "alone"])
            with Burner(taken, processes=max(2, math.ceil(taken))) as burner:
                parts["CPU burner"] = lambda: process_tree(burner.pid)
                channel, recipient = kinds["webhook"]
                drains["webhook", "burner"], _ = _drain(
                    conn, services, rows, channel, recipient, "burner", parts
                )
    finally:
        server.stop()
    bench.done_with(name)
    for kind in kinds:
        alone = drains[kind, "alone"]
        print(
            f"  {kind}: "
            + "; ".join(f"{tag} {fmt_int(r)} rows/s" for (k, tag), r in drains.items() if k == kind)
        )
        steady = drains[kind, "steady"] / alone
        saturated = drains[kind, "saturated"] / alone
        judged = kind == "webhook"  # where the people notified feel it: a provider's latency
        given = fmt_int(drains[kind, "steady"])
        value = f"{given} rows/s = {steady:.2f} of alone ({fmt_int(alone)})"
        line = Line(f"c {kind} drain beside the API at {STEADY} requests/s", value)
        if judged:
            line.target = f">= {DRAIN_TARGET}"
            line.result = "PASS" if steady >= DRAIN_TARGET else "FAIL"
        bench.lines.append(line)
        bench.lines.append(
            Line(
                f"c {kind} drain beside the API saturated",
                f"{fmt_int(drains[kind, 'saturated'])} rows/s = {saturated:.2f} of alone",
            )
        )
    burned = drains["webhook", "burner"] / drains["webhook", "alone"]
    bench.lines.append(
        Line(
            f"c webhook drain beside a CPU burner of the steady load's {taken:.2f} cores",
            f"{fmt_int(drains['webhook', 'burner'])} rows/s = {burned:.2f} of alone",
        )
    )


def _load_cores(loaded: dict[str, float], alone: dict[str, float]) -> float:
    """The cores a load took beside a drain: the API's, its clients', and what PostgreSQL
    took beyond the drain's own (at least a hundredth of a core)."""
    postgres = loaded["PostgreSQL"] - alone["PostgreSQL"]
    return max(0.01, loaded["API"] + loaded[CLIENTS_PART] + max(0.0, postgres))


# Whether a due row is still pending or a row processing: the first of the claim's order (every
# row here has priority 0, and the API's rows beside the drain are due a day later), and a
# processing row's lease. Each walks one
# partial index from its start; a test of the recipient would read the whole table every poll,
# the API's rows included, on the cores the drain is measured on.
UNFINISHED = """
    SELECT coalesce((SELECT next_attempt_at FROM notifications WHERE status = 'pending'
                      ORDER BY priority DESC, next_attempt_at, id LIMIT 1)
                    < now() + interval '1 hour', false)
        OR EXISTS (SELECT 1 FROM notifications
                    WHERE status = 'processing' AND locked_until IS NOT NULL)
"""


def _drain(
    conn: Conn,
    services: Services,
    rows: int,
    channel: str,
    recipient: str,
    tag: str,
    parts: dict[str, Callable[[], list[int]]],
) -> tuple[float, dict[str, float]]:
    """Rows a second of a drain of ``rows`` due rows on ``channel`` (recipients ``recipient``
    with ``{tag}`` filled in: one tag's rows are told apart by it), from their commit to the
    last one sent; the API's rows beside them are not due. Also the cores each of ``parts``
    (processes by name) took meanwhile, which it prints."""
    address = recipient.format(tag=tag)
    meters = {part: CpuMeter() for part in parts}
    for part, meter in meters.items():
        meter.start(parts[part]())
    floor = highest_id(conn)
    began = time.monotonic()
    _, committed = insert_due(conn, rows, channel, address)
    pattern = address.replace("{n}", "%")
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        time.sleep(0.5)
        for part, meter in meters.items():
            meter.sample(parts[part]())
        services.check_alive()
        left = conn.execute(UNFINISHED).fetchone()
        if left is not None and not left[0]:
            break
    else:
        raise SetupError(f"the {tag} drain of {channel} rows did not finish in 600 s")
    found = conn.execute(
        "SELECT count(*), extract(epoch FROM max(sent_at)) FROM notifications"
        " WHERE id > %s AND recipient LIKE %s AND status = 'sent'",
        (floor, pattern),
    ).fetchone()
    assert found is not None
    sent, last = int(found[0]), float(found[1])
    if sent != rows:
        raise SetupError(f"the {tag} drain of {channel} rows sent {sent:,} of {rows:,}")
    wall = time.monotonic() - began
    cores = {part: meter.seconds / wall for part, meter in meters.items()}
    shown = ", ".join(f"{part} {used:.2f}" for part, used in cores.items())
    print(f"    {channel} {tag}: cores busy over its {wall:.1f} s: {shown}", flush=True)
    return sent / (last - committed), cores


TARGETS = [single, bulk, beside]


def main(argv: list[str] | None = None) -> int:
    _options(argv)
    return harness.main(
        __doc__, "api", harness.REDIS, [*NAMES, "requests", "batches"], TARGETS, argv
    )


if __name__ == "__main__":
    sys.exit(main())
