"""A failing spool disk (EIO) under the primary and a read-only one (EROFS) under a
replica, on a real cluster whose spools sit on errfs (a FUSE pass-through with
switchable errors): the append that could not be written is refused naming the member
and the error, the member fails definitely (no silent retry), says why in `brokers
list`, and gives its journals to healthy members, which take appends again; nothing
acknowledged is missing, nothing refused is visible, nobody crashed."""

from __future__ import annotations

import contextlib
import os

import pytest

from protocol import Status
from tests.coordinator.cluster import scrape_metric
from tools.services.disk_faults import errfs

from .harness import (Model, alive, append, append_until, check, cluster_on, node_of,
                      read_ids, route, serve, wait_health)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts need root")

RECORD = 8 << 10


@pytest.mark.parametrize("mode,victim", [("eio", "primary"), ("erofs", "replica")])
async def test_a_failing_disk_fails_the_member_and_its_journals_move(
        etcd, etcd_root, mode: str, victim: str) -> None:  # noqa: ANN001
    with contextlib.ExitStack() as stack:
        fss = [stack.enter_context(errfs(32 << 20, f"s{i}")) for i in range(3)]
        with cluster_on(etcd.url, etcd_root, [str(f.path) for f in fss]) as c:
            await serve(c, replication=2)
            model = Model()
            for _ in range(10):
                assert await append(c, model, RECORD) == Status.OK, model.errors
            primary, members = await route(c)
            target = primary if victim == "primary" else next(m for m in members if m != primary)
            survivor = next(m for m in members if m != target)
            fss[[n.suffix for n in c.nodes].index(target)].fail(mode)
            await append_until(c, model, RECORD, {Status.SPOOL_FAILED, Status.COMMIT_UNKNOWN},
                               via=primary)
            assert target in model.errors[-1][1] and mode.upper() in model.errors[-1][1], \
                model.errors
            # The member failed for good and said why; its journal moved to healthy ones.
            health = await wait_health(c, target, "failed: ")
            assert mode.upper() in health, health
            await append_until(c, model, RECORD, {Status.OK}, timeout=60.0, via=survivor)
            _, now = await route(c)
            assert target not in now, now
            for _ in range(10):
                assert await append(c, model, RECORD, via=survivor) == Status.OK, model.errors
            assert scrape_metric(node_of(c, target).metrics_port, "quire_spool_write_errors_total",
                                 f'{{reason="{mode}"}}') >= 1
            alive(c)
            check(model, await read_ids(c, via=survivor))
