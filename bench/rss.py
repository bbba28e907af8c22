"""Memory of an idle coordinator as it hosts more journals.

A fresh one-coordinator cluster (etcd + 1 coordinator, replication 1); journals are
applied in batches (an etcd transaction holds at most 128 operations by default) until
the coordinator is primary of 1, 100 and 1,000 journals; after each step we wait until
every journal is routed, let it settle, and read VmRSS from /proc. Bounded waits.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from chaos.cluster import LocalCluster
from quire.client import Client
from protocol import FragmentSpec, JournalSpec, LabelSet

__all__ = ["measure_rss"]

BATCH = 100


async def _routed(client: Client, names: set[str], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            entries = await asyncio.wait_for(client.list_journals("bench=rss"), 30)
            if names <= {e.spec.name for e in entries if e.route.primary >= 0}:
                return True
        except Exception:  # noqa: BLE001 - not yet
            pass
        await asyncio.sleep(0.5)
    return False


async def _measure(cluster: LocalCluster, store: str, steps: tuple[int, ...],
                   settle: float) -> dict[str, Any]:
    coord = cluster.coordinators[0]
    out: dict[str, Any] = {"rss_0_journals_mb": coord.rss_bytes() / 2**20}
    client = Client(cluster.endpoints, retry_timeout=30)
    names: set[str] = set()
    try:
        for target in steps:
            new = [f"bench/rss/j-{i:05d}" for i in range(len(names), target)]
            for k in range(0, len(new), BATCH):
                await client.apply([JournalSpec(
                    name=n, replication=1, labels=_labels(),
                    fragment=FragmentSpec(stores=(store,))) for n in new[k:k + BATCH]])
            names.update(new)
            t0 = time.monotonic()
            if not await _routed(client, names, timeout=60 + target * 0.2):
                out[f"rss_{target}_journals_mb"] = None
                out["rss_error"] = f"{target} journals not routed in time"
                break
            out[f"rss_{target}_journals_route_s"] = time.monotonic() - t0
            await asyncio.sleep(settle)
            out[f"rss_{target}_journals_mb"] = coord.rss_bytes() / 2**20
    finally:
        await client.close()
    return out


def _labels() -> LabelSet:
    return LabelSet.of(bench="rss")


def measure_rss(workdir: Path, *, steps: tuple[int, ...] = (1, 100, 1000),
                settle: float = 2.0) -> dict[str, Any]:
    store = (workdir / "rss-store").as_uri() + "/"
    (workdir / "rss-store").mkdir(parents=True, exist_ok=True)
    with LocalCluster(1, zones=("zone-a",), workdir=workdir / "rss-cluster") as cluster:
        return asyncio.run(_measure(cluster, store, steps, settle))
