"""SIGTERM drains a coordinator (coordinator/drain.py): the spools it leads are rolled
through their pipelines, write heads are recorded, and a restart on the same spool
directories serves the content and takes plain appends at the old write head.

No Redis here (nothing is persisted): the closed fragments stay on local disk, which
is where the restarted coordinators read them from."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from protocol import Status

from .cluster import Cluster, Conn, make_workdir, spec, wait_appendable

pytestmark = pytest.mark.timeout(120)


async def _read_all(endpoint: str, journal: str, end: int, timeout: float = 30.0) -> bytes:
    """Read [0, end) once the restarted coordinator serves it (route and sync settle)."""
    deadline = time.monotonic() + timeout
    while True:
        conn = await Conn.open(endpoint)
        try:
            data, metas = await conn.read(journal, 0, end_offset=end)
        except Exception:  # noqa: BLE001 - answered early while the route forms
            data, metas = b"", []
        finally:
            await conn.close()
        if len(data) >= end or time.monotonic() > deadline:
            return data
        await asyncio.sleep(0.1)  # re-read while the restarted member syncs


def _stop_gracefully(c: Cluster) -> None:
    for n in c.nodes:
        c.kill(n, signal.SIGTERM)  # all at once, as `quire up` stops them
    for n in c.nodes:
        assert n.proc.wait(30) == 0, c.tail(n)


@pytest.mark.parametrize("replication", [1, 2])
async def test_sigterm_rolls_and_a_restart_appends_at_the_head(etcd, etcd_root,  # noqa: ANN001
                                                               replication: int) -> None:
    c = Cluster(etcd.url, etcd_root, make_workdir(), extra=["--drain-timeout", "20"])
    for i in range(replication):
        c.add(f"zone-{i}", f"node-{i}")
    j = f"drain/r{replication}"
    try:
        for n in c.nodes:
            c.start(n)
        for n in c.nodes:
            await c.wait_listening(n)
        ep = c.nodes[0].endpoint
        conn = await Conn.open(ep)
        assert (await conn.apply(spec(j, replication=replication))).status == Status.OK
        await conn.close()
        assert (await wait_appendable(ep, j)).status == Status.OK
        conn = await Conn.open(ep)
        records = [b"%03d %s\n" % (i, b"z" * 40) for i in range(30)]
        for r in records:
            resp = await conn.append(j, [r])
            assert resp.status == Status.OK, resp
        await conn.close()
        content = b"".join(records)
        end = len(content)

        _stop_gracefully(c)
        heads = 0
        for n in c.nodes:
            spool = Path(n.spool_dir) / j
            assert not list(spool.glob("*.spool")), "an open spool was left behind"
            # The primary's roll went through its pipeline: every replica closed the
            # same fragment.
            assert [p.name.split("-")[:2] for p in spool.glob("*.raw")] == [
                [f"{0:016x}", f"{end:016x}"]]
            heads += (spool / ".head.json").exists()
        assert heads == replication  # each recorded where it stopped

        for n in c.nodes:
            c.start(n)
        for n in c.nodes:
            await c.wait_listening(n)
        assert (await wait_appendable(ep, j)).status == Status.OK  # a barrier, at the head
        if replication == 1:
            assert await _read_all(ep, j, end) == content  # before anything new commits
        conn = await Conn.open(ep)
        resp = await conn.append(j, [b"after the restart\n"])  # plain: no explicit offset
        await conn.close()
        assert resp.status == Status.OK, resp
        assert (resp.commit.begin, resp.commit.end) == (end, end + len(b"after the restart\n"))
        for n in c.nodes:
            assert await _read_all(n.endpoint, j, resp.commit.end) == content + b"after the restart\n"
    finally:
        c.stop_all()
        if not os.environ.get("QUIRE_KEEP_WORKDIR"):
            shutil.rmtree(c.workdir, ignore_errors=True)
