"""The dashboard's HTTP server in-process, with nothing behind it: a dead etcd and no
coordinators must give a served page and a snapshot listing the failures, promptly."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from dashboards.server import DashboardServer
from dashboards.state import StateCollector
from tools.services import free_port

pytestmark = [pytest.mark.timeout(60), pytest.mark.asyncio(loop_scope="session")]


async def exchange(port: int, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split(" ")[1]), headers, body


@pytest.fixture
async def server():  # type: ignore[no-untyped-def]
    dead_etcd = f"http://127.0.0.1:{free_port()}"
    srv = DashboardServer(StateCollector(dead_etcd, "/quire-none", timeout=0.5), "127.0.0.1", 0)
    await srv.start()
    try:
        yield srv
    finally:
        await srv.close()


async def test_state_with_nothing_reachable(server: DashboardServer) -> None:
    started = time.monotonic()
    status, headers, body = await exchange(server.port, b"GET /api/state HTTP/1.1\r\nHost: x\r\n\r\n")
    assert time.monotonic() - started < 5
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert int(headers["Content-Length"]) == len(body)
    state = json.loads(body)
    assert state["journals"] == [] and state["brokers"] == []
    assert any(e.startswith("etcd http://127.0.0.1:") for e in state["errors"])
    assert any("no coordinator endpoint known" in e for e in state["errors"])


async def test_page_and_bad_requests(server: DashboardServer) -> None:
    status, headers, body = await exchange(server.port, b"GET / HTTP/1.1\r\n\r\n")
    assert status == 200 and headers["Content-Type"].startswith("text/html") and b"<table" in body
    status, headers, body = await exchange(server.port, b"HEAD /style.css HTTP/1.1\r\n\r\n")
    assert status == 200 and body == b"" and int(headers["Content-Length"]) > 0
    assert (await exchange(server.port, b"garbage\r\n\r\n"))[0] == 400
    assert (await exchange(server.port, b"DELETE / HTTP/1.1\r\n\r\n"))[0] == 405
    assert (await exchange(server.port, b"GET /../etc/passwd HTTP/1.1\r\n\r\n"))[0] == 404
    huge = b"GET / HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n"
    assert (await exchange(server.port, huge))[0] == 431


async def test_snapshots_are_shared_within_a_second(server: DashboardServer) -> None:
    a, b = await asyncio.gather(server.collector.snapshot(), server.collector.snapshot())
    assert a is b
