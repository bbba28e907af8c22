"""bench.scale's append phase: 1 KiB appends from 64 tasks round-robin over N journals,
and what its timed window cost (the lane's appends per commit, CPU per append by process).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import Any

from quire.client import Client

from .scale_cluster import CpuMeter, ScaleCluster

__all__ = ["APPEND_SIZE", "APPEND_TASKS", "Window", "appends", "round_robin"]

APPEND_TASKS = 64
APPEND_SIZE = 1024


def round_robin(names: list[str]) -> Callable[[], str]:
    """The next journal of `names` at each call, round-robin (shared by every task)."""
    counter = itertools.count()
    return lambda: names[next(counter) % len(names)]


async def appends(endpoints: list[str], names: list[str], seconds: float,
                  window: Callable[[], Window] | None = None) -> dict[str, Any]:
    """1 KiB appends from APPEND_TASKS tasks round-robin over `names`: first one to each
    journal (its first fragment opens: a spool file, a roll, the backlog's first figure
    — a cost per fragment, timed apart as `first_appends_per_s`), then for `seconds`
    (`appends_per_s`: the steady rate, every journal's fragment open, as a producer
    that has been writing finds them). `window` starts its measure then."""
    client = Client(endpoints, retry_timeout=30)
    data = b"x" * (APPEND_SIZE - 1) + b"\n"
    # As a producer over many journals would: list them first (the listing's routes
    # prime the client's route cache, so no first append is proxied by a seed).
    await client.list_journals("bench=scale")  # (_labels())
    count = errors = 0
    first_error = ""

    async def task(nxt: Callable[[], str | None], stop: float) -> None:
        nonlocal count, errors, first_error
        while time.monotonic() < stop:
            name = nxt()
            if name is None:
                return
            try:
                await asyncio.wait_for(client.append(name, data), 60)
                count += 1
            except Exception as exc:  # noqa: BLE001 - counted and reported
                errors += 1
                first_error = first_error or repr(exc)

    async def run(nxt: Callable[[], str | None], stop: float) -> float:
        t0 = time.monotonic()
        async with asyncio.TaskGroup() as tg:
            for _ in range(APPEND_TASKS):
                tg.create_task(task(nxt, stop))
        return time.monotonic() - t0

    try:
        each = iter(names)
        first_s = await run(lambda: next(each, None), time.monotonic() + 120 + 0.02 * len(names))
        first, count = count, 0
        measure = window() if window is not None else None
        elapsed = await run(round_robin(names), time.monotonic() + seconds)
    finally:
        await client.close()
    out = {"appends": count, "appends_per_s": count / elapsed, "append_errors": errors,
           "append_first_error": first_error, "first_appends": first,
           "first_appends_per_s": first / first_s if first_s > 0 else None}
    if measure is not None:
        out.update(measure.end(count))
    return out


class Window:
    """What the append window cost: the whole-append lane's appends per commit (its
    group commit: how many appends of one journal one commit carried, over every
    coordinator's /metrics), and CPU per append of the client (this process), the
    coordinators together, and the rest (worker, beat, etcd, Redis), in µs.

    The rate over N journals is set by commits, not appends: a commit's replication
    (proposal, spool writes at 3 members, acknowledgements) is most of an append's cost.
    64 tasks over 10 journals give each commit several appends; over N >= 64, one."""

    def __init__(self, cluster: ScaleCluster) -> None:
        self.cluster = cluster
        self.meter = CpuMeter(cluster)
        self.lane = self._lane()

    def _lane(self) -> tuple[float, float]:
        whole = commits = 0.0
        for i in range(len(self.cluster.coordinators)):
            try:
                m = self.cluster.metrics(i)
            except OSError:
                continue
            whole += m.get("quire_appends_whole_total", 0.0)
            commits += m.get("quire_lane_commits_total", 0.0)
        return whole, commits

    def end(self, appends: int) -> dict[str, Any]:
        used, (whole, commits) = self.meter.used(), self._lane()
        us = (lambda s: round(1e6 * s / appends, 1)) if appends else (lambda s: None)
        coord = sum(v for k, v in used.items() if k.startswith("coordinator "))
        rest = sum(v for k, v in used.items() if k != "client" and not k.startswith("coordinator "))
        lane_commits = commits - self.lane[1]
        return {"appends_per_commit": round((whole - self.lane[0]) / lane_commits, 2)
                if lane_commits else None,
                "append_cpu_us": {"client": us(used["client"]), "coordinators": us(coord),
                                  "others": us(rest), "all": us(sum(used.values()))}}
