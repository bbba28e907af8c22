"""Test helpers: coordinator subprocesses on loopback and a tiny client over FrameStream."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field

from protocol import (
    AppendAbort,
    AppendChunk,
    AppendCommit,
    AppendRequest,
    AppendResponse,
    ApplyChange,
    ApplyRequest,
    ApplyResponse,
    FragmentSpec,
    Hello,
    HelloAck,
    JournalSpec,
    ListRequest,
    ListResponse,
    ReadContent,
    ReadRequest,
    ReadResponse,
    Status,
)
from protocol.fragment import Codec
from protocol.stream import FrameStream
from tools.log_crashes import crashes
from tools.services import free_port


class Conn:
    def __init__(self, stream: FrameStream) -> None:
        self.s = stream

    @classmethod
    async def open(cls, endpoint: str, token: str = "", ssl=None) -> Conn:  # noqa: ANN001
        s = await FrameStream.connect(endpoint, timeout=5.0, ssl=ssl)
        await s.send(Hello(token=token))
        await asyncio.wait_for(s.read_message(HelloAck), 5.0)
        return cls(s)

    async def close(self) -> None:
        await self.s.close()

    async def append(self, journal: str, chunks: list[bytes], **kw) -> AppendResponse:  # noqa: ANN003
        self.s.write(AppendRequest(journal=journal, **kw))
        for c in chunks:
            self.s.write(AppendChunk(), c)
            await self.s.drain()
        await self.s.send(AppendCommit())
        msg, _ = await asyncio.wait_for(self.s.read_message(AppendResponse), 30.0)
        return msg

    async def apply(self, *specs: JournalSpec) -> ApplyResponse:
        await self.s.send(ApplyRequest(changes=tuple(ApplyChange(upsert=s, expect_mod_revision=-1)
                                                     for s in specs)))
        msg, _ = await asyncio.wait_for(self.s.read_message(ApplyResponse), 30.0)
        return msg

    async def list(self) -> ListResponse:
        await self.s.send(ListRequest())
        msg, _ = await asyncio.wait_for(self.s.read_message(ListResponse), 30.0)
        return msg

    async def read(self, journal: str, offset: int, end_offset: int = 0,
                   block: bool = False) -> tuple[bytes, list[ReadResponse]]:
        await self.s.send(ReadRequest(journal=journal, offset=offset, end_offset=end_offset,
                                      block=block))
        out = bytearray()
        metas: list[ReadResponse] = []
        pos = offset
        while True:
            frame = await asyncio.wait_for(self.s.read(), 30.0)
            m = frame.message
            if isinstance(m, ReadResponse):
                metas.append(m)
                if m.status != Status.OK:
                    return bytes(out), metas
                pos = m.offset
            elif isinstance(m, ReadContent):
                assert m.offset == pos, (m.offset, pos)
                out += frame.payload
                pos += len(frame.payload)
                if end_offset and pos >= end_offset:
                    return bytes(out), metas
            else:
                raise AssertionError(f"unexpected {m}")


def spec(name: str, replication: int = 3, length: int = 1 << 20) -> JournalSpec:
    return JournalSpec(name=name, replication=replication,
                       fragment=FragmentSpec(length=length, compression_codec=Codec.NONE))


@dataclass
class Node:
    zone: str
    suffix: str
    port: int
    spool_dir: str
    proc: subprocess.Popen | None = None
    log_path: str = ""

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass
class Cluster:
    etcd_url: str
    root: str
    workdir: str
    nodes: list[Node] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    token: str = ""
    """Presented by wait_listening when the coordinators have auth on."""
    ssl: object = None
    """A client SSLContext when the coordinators serve TLS."""

    def add(self, zone: str, suffix: str) -> Node:
        port = free_port()
        node = Node(zone, suffix, port, os.path.join(self.workdir, f"spool-{suffix}"))
        self.nodes.append(node)
        return node

    def start(self, node: Node) -> None:
        node.log_path = os.path.join(self.workdir, f"{node.suffix}.log")
        argv = [sys.executable, "-m", "coordinator.main", "--zone", node.zone, "--id", node.suffix,
                "--listen", node.endpoint, "--etcd", self.etcd_url, "--root", self.root,
                "--spool-dir", node.spool_dir, "--lease-ttl", "3", "--log-format", "json",
                *self.extra]
        with open(node.log_path, "ab") as logf:
            node.proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    async def wait_listening(self, node: Node, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                c = await Conn.open(node.endpoint, self.token, self.ssl)
                await c.close()
                return
            except (OSError, asyncio.TimeoutError, Exception):  # noqa: BLE001
                if node.proc is not None and node.proc.poll() is not None:
                    raise RuntimeError(f"{node.suffix} exited: {self.tail(node)}")
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)  # connection attempts against a starting process

    def kill(self, node: Node, sig: int = signal.SIGKILL) -> None:
        if node.proc is not None and node.proc.poll() is None:
            node.proc.send_signal(sig)

    def stop_all(self) -> None:
        for n in self.nodes:
            self.kill(n, signal.SIGTERM)
        for n in self.nodes:
            if n.proc is not None:
                try:
                    n.proc.wait(15)
                except subprocess.TimeoutExpired:
                    n.proc.kill()
                    n.proc.wait(5)

    def crashes(self) -> list[str]:
        """Every caught crash the coordinators logged (tools/log_crashes.py)."""
        return crashes((node.suffix, node.log_path) for node in self.nodes)

    def tail(self, node: Node, n: int = 30) -> str:
        try:
            with open(node.log_path, "rb") as f:
                return b"".join(f.readlines()[-n:]).decode(errors="replace")
        except OSError:
            return ""


async def until(cond, timeout: float, what: str, interval: float = 0.2):  # noqa: ANN001, ANN201
    """Poll a condition (a listing, another process's observable state; a coroutine
    function is awaited) until it is truthy, and return its value; fail naming `what`
    after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        await asyncio.sleep(interval)


async def wait_appendable(endpoint: str, journal: str, timeout: float = 30.0,
                          token: str = "", ssl=None) -> AppendResponse:  # noqa: ANN001
    """Zero-byte appends until one succeeds (the allocator and pulse need a moment)."""
    deadline = time.monotonic() + timeout
    while True:
        conn = await Conn.open(endpoint, token, ssl)
        try:
            resp = await conn.append(journal, [])
        except Exception:  # noqa: BLE001 - the broker answered early and closed
            resp = AppendResponse(status=Status.UNAVAILABLE)
        finally:
            await conn.close()
        if resp.status == Status.OK or time.monotonic() > deadline:
            return resp
        await asyncio.sleep(0.1)  # retry a barrier while the route forms


def scrape_metric(port: int, name: str, labels: str = "") -> float | None:
    """One sample of a coordinator's /metrics (`labels` as exported, e.g. '{status="OK"}');
    None if it is not exported."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(f"{name}{labels} "):
                return float(line.split()[1])
    return None


async def serve_journal(cluster: Cluster, journal: str, replication: int = 3) -> None:
    """Every node listening, `journal` applied at `replication` and taking appends."""
    for n in cluster.nodes:
        await cluster.wait_listening(n)
    conn = await Conn.open(cluster.nodes[0].endpoint)
    try:
        assert (await conn.apply(spec(journal, replication=replication))).status == Status.OK
    finally:
        await conn.close()
    assert (await wait_appendable(cluster.nodes[0].endpoint, journal)).status == Status.OK


async def journal_route(endpoint: str, journal: str):  # noqa: ANN201
    """`journal`'s route as the coordinator at `endpoint` lists it now."""
    conn = await Conn.open(endpoint)
    try:
        listing = await conn.list()
    finally:
        await conn.close()
    return next(e.route for e in listing.journals if e.spec.name == journal)


def make_workdir() -> str:
    return tempfile.mkdtemp(prefix="quire-coord-")


@contextlib.contextmanager
def running(etcd_url: str, root: str, n: int = 3, extra: list[str] | None = None,  # noqa: ANN201
            prefix: str = "node"):
    """`n` coordinators in two zones (<prefix>-0 … <prefix>-{n-1}), started; stopped and
    their workdir removed afterwards (kept with QUIRE_KEEP_WORKDIR)."""
    c = Cluster(etcd_url, root, make_workdir(), extra=list(extra or ()))
    for i in range(n):
        c.add(f"zone-{i % 2}", f"{prefix}-{i}")
    for node in c.nodes:
        c.start(node)
    try:
        yield c
        c.stop_all()
        # However the test treated them, no coordinator caught a crash of its own (a
        # compiled type check once failed in every replicate connection's close).
        assert not c.crashes(), "\n".join(c.crashes())
    finally:
        c.stop_all()
        if not os.environ.get("QUIRE_KEEP_WORKDIR"):
            shutil.rmtree(c.workdir, ignore_errors=True)
