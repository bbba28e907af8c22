"""Coordinators whose wall clocks are minutes off (faketime: one +5 min, one -5 min, one
true), on a real cluster: appends, a kill -9 of the primary and the failover behave as
with true clocks — leases and fencing are etcd's, never a local clock's — and nothing
acknowledged is missing, nothing refused visible. (What each feature tolerates:
docs/reliability.md, "Disk and clock faults".)"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import time

import pytest

from protocol import Status

from .harness import Model, alive, append, append_until, check, cluster_on, node_of, read_ids, route, serve

FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"

pytestmark = pytest.mark.skipif(not os.path.exists(FAKETIME_LIB), reason="faketime not installed")

SKEWS = (300, -300, 0)


def _env(skew: int) -> dict[str, str]:
    return {"LD_PRELOAD": FAKETIME_LIB, "FAKETIME": f"{skew:+d}"} if skew else {}


def _log_clock(path: str) -> float:
    """How far the process's clock is off: its last log line's timestamp (its clock)
    against the log file's modification time (the kernel's)."""
    stamp = ""
    with open(path) as f:
        for line in f:
            if line.startswith("{"):
                stamp = json.loads(line).get("timestamp", stamp)
    when = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    return when - os.stat(path).st_mtime


async def test_skewed_clocks_keep_leases_failover_and_data_correct(etcd, etcd_root, tmp_path) -> None:  # noqa: ANN001
    dirs = [str(tmp_path / f"spool-{i}") for i in range(3)]
    with cluster_on(etcd.url, etcd_root, dirs, envs=[_env(s) for s in SKEWS]) as c:
        await serve(c, replication=2)
        for node, skew in zip(c.nodes, SKEWS):  # the clocks really are off
            assert abs(_log_clock(node.log_path) - skew) < 60, (node.suffix, skew)
        model = Model()
        for _ in range(20):
            assert await append(c, model, 4096) == Status.OK, model.errors
        primary, _ = await route(c)
        victim = node_of(c, primary)
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(10)
        survivor = next(n for n in c.nodes if n is not victim)
        t0 = time.monotonic()
        await append_until(c, model, 4096, {Status.OK}, timeout=60.0, via=survivor.suffix)
        failover = time.monotonic() - t0
        for _ in range(20):
            assert await append(c, model, 4096, via=survivor.suffix) == Status.OK, model.errors
        new_primary, members = await route(c)
        assert new_primary and new_primary != primary, (new_primary, members)
        c.nodes.remove(victim)  # (stopped: alive() and the reads are of the others)
        alive(c)
        for n in c.nodes:
            check(model, await read_ids(c, via=n.suffix))
        assert failover < 30.0, failover
