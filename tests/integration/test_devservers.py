"""The webhook receiver the compose and trial stacks run (scripts/devservers.py), as a real
process: what it does to the sends it answers is part of what those tests measure."""

from __future__ import annotations

import json
import socket
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server_process import free_port, listening, start_server, stop_server

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "devservers.py"
#: Enough kept entries that ``/received`` is megabytes, more than the sockets' buffers hold.
ENTRIES = 8000


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    args = [sys.executable, str(SCRIPT), "receiver", "--port", str(port)]
    proc = start_server(
        args, tmp_path / "receiver.log", lambda: listening(port), what="receiver", timeout=30
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_server(proc)


def _post(url: str, body: bytes, timeout: float) -> float:
    started = time.monotonic()
    request = urllib.request.Request(url, data=body, headers={"webhook-id": "n"})
    with urllib.request.urlopen(request, timeout=timeout) as r:
        r.read()
    return time.monotonic() - started


def test_a_reader_that_stops_reading_the_list_holds_up_no_send(receiver: str) -> None:
    """A container's health check reads the headers and exits: while it goes, the sends beside
    it are answered (they used to wait for it, time out and be sent again)."""
    body = json.dumps({"payload": {"n": "x" * 400}}).encode()
    for _ in range(ENTRIES):
        _post(f"{receiver}/hook", body, timeout=10)
    host, port = receiver.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as stalled:
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.sendall(b"GET /received HTTP/1.1\r\nHost: receiver\r\n\r\n")
        assert stalled.recv(12) == b"HTTP/1.0 200"  # the list is being written, and not read
        time.sleep(0.5)
        assert _post(f"{receiver}/hook", body, timeout=5) < 5
    with urllib.request.urlopen(f"{receiver}/health", timeout=5) as r:
        assert json.load(r) == {"ok": True}
