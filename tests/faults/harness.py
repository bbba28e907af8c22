"""What the disk-fault tests share: coordinators whose spool directories are small
filesystems the test controls (tools/services/disk_faults.py), a model of what each
append was answered, and the checks every fault ends with: nothing acknowledged is
missing, nothing refused is visible, no coordinator crashed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from protocol import ListBrokersRequest, ListBrokersResponse, ListRequest, Status
from tests.coordinator.cluster import Cluster, Conn, make_workdir, spec, wait_appendable
from tools.services import free_port

J = "faults/disk"


@dataclass
class Model:
    """Every append's id and answer: acknowledged, refused (definite) or unknown."""

    acked: list[int] = field(default_factory=list)
    refused: list[int] = field(default_factory=list)
    unknown: list[int] = field(default_factory=list)
    errors: list[tuple[Status, str]] = field(default_factory=list)
    next_id: int = 0

    def record(self, size: int) -> tuple[int, bytes]:
        i, self.next_id = self.next_id, self.next_id + 1
        head = b"%08d|" % i
        return i, head + b"x" * (size - len(head) - 1) + b"\n"


def start(c: Cluster, node, extra: list[str], env: dict[str, str] | None = None) -> int:  # noqa: ANN001
    """Start `node` as Cluster.start does, with its own metrics port (and `env` added to
    its environment); returns the port."""
    port = free_port()
    node.log_path = os.path.join(c.workdir, f"{node.suffix}.log")
    argv = [sys.executable, "-m", "coordinator.main", "--zone", node.zone, "--id", node.suffix,
            "--listen", node.endpoint, "--etcd", c.etcd_url, "--root", c.root,
            "--spool-dir", node.spool_dir, "--lease-ttl", "3", "--log-format", "json",
            "--metrics-port", str(port), *c.extra, *extra]
    with open(node.log_path, "ab") as logf:
        node.proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT,
                                     start_new_session=True, env={**os.environ, **(env or {})})
    node.metrics_port = port
    node.env = env
    return port


@contextlib.contextmanager
def cluster_on(etcd_url: str, root: str, spool_dirs: list[str], extra: list[str] | None = None,
               per_node: list[list[str]] | None = None,
               envs: list[dict[str, str]] | None = None) -> Iterator[Cluster]:
    """Coordinators node-0.. with the given spool directories (one each)."""
    c = Cluster(etcd_url, root, make_workdir())
    for i, d in enumerate(spool_dirs):
        node = c.add(f"zone-{i % 2}", f"node-{i}")
        node.spool_dir = d
    for i, node in enumerate(c.nodes):
        start(c, node, [*(extra or []), *((per_node or [])[i] if per_node else [])],
              envs[i] if envs else None)
    try:
        yield c
    finally:
        c.stop_all()
        if not os.environ.get("QUIRE_KEEP_WORKDIR"):
            shutil.rmtree(c.workdir, ignore_errors=True)


async def serve(c: Cluster, length: int = 64 << 10, replication: int = 3) -> None:
    for n in c.nodes:
        await c.wait_listening(n)
    conn = await Conn.open(c.nodes[0].endpoint)
    try:
        assert (await conn.apply(spec(J, replication=replication, length=length))).status == Status.OK
    finally:
        await conn.close()
    assert (await wait_appendable(c.nodes[0].endpoint, J)).status == Status.OK


def live(c: Cluster):  # noqa: ANN201
    """The first node whose process runs."""
    return next(n for n in c.nodes if n.proc is not None and n.proc.poll() is None)


async def route(c: Cluster) -> tuple[str, list[str]]:
    """(primary suffix, member suffixes) of J."""
    conn = await Conn.open(live(c).endpoint)
    try:
        resp = await conn.list()
    finally:
        await conn.close()
    r = next(e.route for e in resp.journals if e.spec.name == J)
    pid = r.primary_id
    return pid.suffix if pid else "", [m.suffix for m in r.members]


def node_of(c: Cluster, suffix: str):  # noqa: ANN201
    return next(n for n in c.nodes if n.suffix == suffix)


async def append(c: Cluster, model: Model, size: int, via: str = "") -> Status:
    """One record through `via` (default: any live node); its answer goes in the model."""
    node = node_of(c, via) if via else c.nodes[0]
    i, data = model.record(size)
    try:
        conn = await Conn.open(node.endpoint)
    except Exception:  # noqa: BLE001
        model.refused.append(i)
        return Status.UNAVAILABLE
    try:
        resp = await conn.append(J, [data])
        status, message = resp.status, resp.message
    except Exception as exc:  # noqa: BLE001 - the broker answered and closed early
        status, message = Status.COMMIT_UNKNOWN, repr(exc)
    finally:
        await conn.close()
    if status == Status.OK:
        model.acked.append(i)
    elif status == Status.COMMIT_UNKNOWN:
        model.unknown.append(i)
        model.errors.append((status, message))
    else:
        model.refused.append(i)
        model.errors.append((status, message))
    return status


async def append_until(c: Cluster, model: Model, size: int, want: set[Status],
                       timeout: float = 60.0, via: str = "") -> Status:
    deadline = time.monotonic() + timeout
    while True:
        status = await append(c, model, size, via)
        if status in want:
            return status
        assert time.monotonic() < deadline, (status, model.errors[-3:])
        await asyncio.sleep(0.05)  # another append, not a readiness guess: bounded above


async def read_ids(c: Cluster, via: str = "") -> list[int]:
    """The record ids the journal holds, in order (read to the write head)."""
    node = node_of(c, via) if via else c.nodes[0]
    conn = await Conn.open(node.endpoint)
    try:
        data, metas = await conn.read(J, 0)
    finally:
        await conn.close()
    out = []
    for line in data.split(b"\n"):
        if line:
            out.append(int(line.split(b"|", 1)[0]))
    return out


def check(model: Model, ids: list[int]) -> None:
    """Nothing acknowledged is missing (once each, in order), nothing refused visible."""
    assert len(ids) == len(set(ids)), "a record landed twice"
    seen = set(ids)
    missing = [i for i in model.acked if i not in seen]
    assert not missing, f"acknowledged but missing: {missing[:10]}"
    visible = [i for i in model.refused if i in seen]
    assert not visible, f"refused but visible: {visible[:10]}"
    extra = seen - set(model.acked) - set(model.unknown)
    assert not extra, f"never appended: {sorted(extra)[:10]}"
    acked = [i for i in ids if i in set(model.acked)]
    assert acked == sorted(acked), "acknowledged records out of order"


async def brokers(c: Cluster) -> dict[str, str]:
    """suffix -> health, as `quire brokers list` shows it."""
    conn = await Conn.open(live(c).endpoint)
    try:
        await conn.s.send(ListBrokersRequest())
        resp, _ = await asyncio.wait_for(conn.s.read_message(ListBrokersResponse), 30.0)
    finally:
        await conn.close()
    return {b.id.suffix: b.health for b in resp.brokers}


def alive(c: Cluster) -> None:
    for n in c.nodes:
        assert n.proc is not None and n.proc.poll() is None, f"{n.suffix} exited: {c.tail(n)}"


async def wait_health(c: Cluster, suffix: str, prefix: str, timeout: float = 30.0) -> str:
    """`suffix`'s health once it starts with `prefix` (the member key is rewritten
    asynchronously, and a resigning member is briefly absent)."""
    deadline = time.monotonic() + timeout
    while True:
        health = (await brokers(c)).get(suffix)
        if health is not None and (health.startswith(prefix) if prefix else health == ""):
            return health
        assert time.monotonic() < deadline, (suffix, health)
        await asyncio.sleep(0.1)  # polling etcd's view, bounded above
