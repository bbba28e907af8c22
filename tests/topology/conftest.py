"""Fixtures for topology tests: an etcd client, member processes, condition waits."""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator

import aetcd
import pytest
import pytest_asyncio

from topology.etcd import connect
from topology.keyspace import KeySpace
from tools.services import EtcdService, Service


# Function loop scope: the grpc channel must live on the loop of the test using it.
@pytest_asyncio.fixture(loop_scope="function")
async def client(etcd: EtcdService) -> AsyncIterator[aetcd.Client]:
    c = await connect(etcd.url)
    try:
        yield c
    finally:
        await c.close()


async def wait_until(ks: KeySpace, predicate: Callable[[], object], timeout: float,
                     what: str = "condition") -> object:
    """Wait for `predicate` to hold, re-checking on every keyspace change (no polling)."""
    deadline = time.monotonic() + timeout
    while True:
        seen = ks.changed_revision
        value = predicate()
        if value:
            return value
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await ks.wait_changed(seen, timeout=remaining)


class Member(Service):
    """A `python -m topology.topology_member` process."""

    stop_timeout = 40.0

    def __init__(self, etcd: EtcdService, root: str, zone: str, suffix: str, *,
                 limit: int = 100, ttl: float = 3.0, advertise: bool = True,
                 drain_timeout: float = 30.0) -> None:
        argv = [sys.executable, "-m", "topology.topology_member", "--etcd", etcd.url,
                "--root", root, "--zone", zone, "--id", suffix, "--endpoint",
                f"127.0.0.1:{9000 + abs(hash(suffix)) % 1000}", "--limit", str(limit),
                "--ttl", str(ttl), "--drain-timeout", str(drain_timeout)]
        if advertise:
            argv.append("--advertise")
        super().__init__(f"member-{zone}-{suffix}", argv, env={"PYTHONUNBUFFERED": "1"},
                         ready_timeout=30.0)
        self.zone, self.suffix = zone, suffix

    def probe(self) -> bool:
        return "ready " in self.log_text()


@pytest.fixture
def members(etcd: EtcdService, etcd_root: str) -> Iterator[Callable[..., Member]]:
    started: list[Member] = []

    def make(zone: str, suffix: str, **kw: object) -> Member:
        m = Member(etcd, etcd_root, zone, suffix, **kw)  # type: ignore[arg-type]
        started.append(m)
        return m

    yield make
    for m in started:
        m.kill()
        m.close()
