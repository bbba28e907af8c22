"""Fixtures of the consumer tests: real etcd, three coordinators, a file:// store, and
consumer member processes (`python -m consumers.main run …`)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

import pytest
import pytest_asyncio

from protocol import FragmentSpec, JournalSpec, LabelSet
from protocol.fragment import Codec
from quire.client import Client
from tests.coordinator.cluster import Cluster, make_workdir, wait_appendable
from topology.etcd import connect


@dataclass
class Env:
    cluster: Cluster
    store_url: str
    endpoints: str
    workdir: str
    members: list["MemberProc"] = field(default_factory=list)


def journal(name: str, store: str, replication: int = 3, **labels: str) -> JournalSpec:
    return JournalSpec(name=name, replication=replication, labels=LabelSet.of(labels),
                       fragment=FragmentSpec(length=1 << 20, compression_codec=Codec.NONE,
                                             stores=(store,), refresh_interval=5.0))


@pytest.fixture
def coordinators(etcd, etcd_root) -> Iterator[Env]:  # noqa: ANN001
    workdir = make_workdir()
    c = Cluster(etcd.url, etcd_root, workdir)
    for i in range(3):
        c.add(f"zone-{i % 2}", f"node-{i}")
    for node in c.nodes:
        c.start(node)
    store = os.path.join(workdir, "store")
    os.makedirs(store)
    env = Env(c, f"file://{store}/", ",".join(n.endpoint for n in c.nodes), workdir)
    try:
        yield env
    finally:
        for m in env.members:
            m.kill()
        c.stop_all()
        if not os.environ.get("QUIRE_KEEP_WORKDIR"):
            shutil.rmtree(workdir, ignore_errors=True)


async def create_journals(env: Env, specs: list[JournalSpec]) -> None:
    for n in env.cluster.nodes:
        await env.cluster.wait_listening(n)
    async with Client(env.endpoints) as client:
        await client.apply(specs)
    for s in specs:
        r = await wait_appendable(env.cluster.nodes[0].endpoint, s.name)
        assert r.status.name == "OK", (s.name, r)


class MemberProc:
    """A `python -m consumers.main run APP` process."""

    def __init__(self, env: Env, etcd_url: str, root: str, zone: str, suffix: str, app: str,
                 ttl: float = 3.0, snapshot_interval: float = 2.0, metrics_port: int = 0,
                 selector_refresh: float = 10.0) -> None:
        self.zone, self.suffix = zone, suffix
        self.data_dir = os.path.join(env.workdir, f"consumer-{zone}-{suffix}")
        self.log_path = self.data_dir + ".log"
        argv = [sys.executable, "-m", "consumers.main", "run", app, "--etcd", etcd_url,
                "--root", root, "--zone", zone, "--id", suffix, "--broker", env.endpoints,
                "--data-dir", self.data_dir, "--ttl", str(ttl), "--snapshot-interval",
                str(snapshot_interval), "--log-format", "json", "--metrics-port", str(metrics_port),
                "--selector-refresh", str(selector_refresh)]
        self.logf = open(self.log_path, "ab")  # noqa: SIM115 - closed in kill()
        self.proc = subprocess.Popen(argv, stdout=self.logf, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        env.members.append(self)

    @property
    def id(self) -> str:
        return f"{self.zone}#{self.suffix}"

    def log_text(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    async def ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while "ready " not in self.log_text():
            if self.proc.poll() is not None:
                raise AssertionError(f"member exited {self.proc.returncode}:\n{self.log_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"member not ready:\n{self.log_text()[-3000:]}")
            await asyncio.sleep(0.05)  # polling a log file for one line: no event to wait on

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def terminate(self, timeout: float = 30.0) -> int:
        self.signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.logf.close()


@pytest.fixture
def member_factory(coordinators: Env, etcd, etcd_root) -> Callable[..., MemberProc]:  # noqa: ANN001
    def make(zone: str, suffix: str, app: str = "consumers.examples.counts:Counts",
             **kw: float) -> MemberProc:
        return MemberProc(coordinators, etcd.url, etcd_root, zone, suffix, app, **kw)

    return make


@pytest_asyncio.fixture(loop_scope="function")
async def etcd_client(etcd) -> AsyncIterator:  # noqa: ANN001
    c = await connect(etcd.url)
    try:
        yield c
    finally:
        await c.close()


async def wait_for(predicate: Callable[[], object], timeout: float, what: str,
                   interval: float = 0.1) -> object:
    """Poll an async-less or async predicate until truthy (state lives in other processes)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)  # other processes' state: polled with a deadline
