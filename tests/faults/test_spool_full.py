"""A full spool disk (ENOSPC) on the primary and on a replica, on a real 3-node cluster
whose spools are small tmpfs filesystems: the append that could not be written is
refused (SPOOL_FULL naming the member and ENOSPC, or — for a replica that failed after
the commit left — COMMIT_UNKNOWN naming them), later appends are refused before any
content leaves, the member says so (brokers list, quire_spool_write_errors_total), reads
go on, nobody crashes, and once room returns appends resume by themselves. Also the
low-water mark: appends are refused before the disk is full."""

from __future__ import annotations

import time

import pytest

from protocol import Status
from tests.coordinator.cluster import scrape_metric
from tools.services.disk_faults import fill, tmpfs

from .harness import (Model, alive, append, append_until, check, cluster_on, node_of,
                      read_ids, route, serve, wait_health)

pytestmark = pytest.mark.skipif(__import__("os").geteuid() != 0, reason="mounts need root")

SIZE = 16 << 20
RECORD = 16 << 10


@pytest.fixture
def spools():  # noqa: ANN201
    with tmpfs(SIZE, "s0") as a, tmpfs(SIZE, "s1") as b, tmpfs(SIZE, "s2") as c:
        yield [str(a), str(b), str(c)]


async def _full(etcd, etcd_root, spools, victim: str) -> None:  # noqa: ANN001
    """Fill the spool of the primary (victim="primary") or of a replica."""
    with cluster_on(etcd.url, etcd_root, spools) as c:
        await serve(c)
        model = Model()
        for _ in range(20):
            assert await append(c, model, RECORD) == Status.OK, model.errors
        primary, members = await route(c)
        target = primary if victim == "primary" else next(m for m in members if m != primary)
        node = node_of(c, target)
        ballast = fill(node.spool_dir, leave=RECORD // 2)
        status = await append_until(c, model, RECORD, {Status.SPOOL_FULL, Status.COMMIT_UNKNOWN},
                                    via=primary)
        first = model.errors[-1][1]
        assert target in first and "ENOSPC" in first, model.errors
        # Later appends are refused before any content leaves: definite, with the reason.
        for _ in range(5):
            assert await append(c, model, RECORD, via=primary) == Status.SPOOL_FULL, model.errors
            assert target in model.errors[-1][1], model.errors[-1]
        await wait_health(c, target, "full: ")
        assert scrape_metric(node.metrics_port, "quire_spool_write_errors_total",
                             '{reason="enospc"}') >= 1
        alive(c)
        check(model, await read_ids(c, via=primary))  # reads go on meanwhile
        # Room returns: appends resume by themselves.
        ballast.unlink()
        t0 = time.monotonic()
        await append_until(c, model, RECORD, {Status.OK}, timeout=30.0, via=primary)
        for _ in range(10):
            assert await append(c, model, RECORD) == Status.OK, model.errors
        assert time.monotonic() - t0 < 30.0
        await wait_health(c, target, "")
        alive(c)
        for n in c.nodes:
            check(model, await read_ids(c, via=n.suffix))
        assert status in (Status.SPOOL_FULL, Status.COMMIT_UNKNOWN)


async def test_enospc_on_the_primary_is_refused_and_appends_resume(etcd, etcd_root, spools) -> None:  # noqa: ANN001
    await _full(etcd, etcd_root, spools, "primary")


async def test_enospc_on_a_replica_breaks_the_pipeline_cleanly(etcd, etcd_root, spools) -> None:  # noqa: ANN001
    await _full(etcd, etcd_root, spools, "replica")


async def test_the_low_water_mark_refuses_before_the_disk_is_full(etcd, etcd_root, spools) -> None:  # noqa: ANN001
    with cluster_on(etcd.url, etcd_root, spools, extra=["--spool-low-water", str(4 << 20)]) as c:
        await serve(c)
        model = Model()
        primary, _ = await route(c)
        node = node_of(c, primary)
        ballast = fill(node.spool_dir, leave=3 << 20)  # below the mark, far from full
        assert await append_until(c, model, RECORD, {Status.SPOOL_FULL}, timeout=30.0,
                                  via=primary) == Status.SPOOL_FULL
        assert "low-water" in model.errors[-1][1] and primary in model.errors[-1][1]
        assert scrape_metric(node.metrics_port, "quire_spool_write_errors_total",
                             '{reason="enospc"}') in (None, 0.0)  # refused, never failed
        ballast.unlink()
        await append_until(c, model, RECORD, {Status.OK}, timeout=30.0, via=primary)
        alive(c)
        check(model, await read_ids(c, via=primary))
