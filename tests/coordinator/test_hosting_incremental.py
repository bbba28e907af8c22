"""A keyspace change costs the journals it touched, not every hosted journal (#49).

Before, every etcd batch (one route advertised, one spec edited) made the coordinator
re-examine each of its journals (resolve, fence check, pulse want): filling N routes
was O(N^2) and a coordinator of 1,000 journals spent its core on it. The counter
`quire_hosting_reconciled_total` counts the journals examined.
"""

from __future__ import annotations

import asyncio

from bench.scale import full_routes
from bench.scale_cluster import etcd_assignments
from protocol import LabelSet, Status
from tools.services import free_port

from .cluster import Cluster, Conn, make_workdir, scrape_metric, spec, until

JOURNALS = 120


async def test_one_spec_change_reexamines_that_journal_alone(etcd, etcd_root) -> None:  # noqa: ANN001
    port = free_port()
    c = Cluster(etcd.url, etcd_root, make_workdir(),
                extra=["--metrics-port", str(port), "--journal-limit", "1000"])
    node = c.add("zone-a", "node-0")
    c.start(node)
    try:
        await c.wait_listening(node)
        names = [f"inc/j-{i:03d}" for i in range(JOURNALS)]
        conn = await Conn.open(node.endpoint)
        try:
            for k in range(0, JOURNALS, 60):
                resp = await conn.apply(*[spec(n, replication=1) for n in names[k:k + 60]])
                assert resp.status == Status.OK, resp

            async def all_full() -> bool:
                kvs = await asyncio.to_thread(etcd_assignments, etcd.url, etcd_root)
                return set(names) <= full_routes(kvs, 1, etcd_root)

            await until(all_full, 90, "every route advertised", interval=0.5)
            counted = lambda: scrape_metric(port, "quire_hosting_reconciled_total")  # noqa: E731
            before = await asyncio.to_thread(counted)
            assert before is not None and before >= JOURNALS
            edited = spec(names[7], replication=1)
            edited = type(edited)(**{**{f: getattr(edited, f) for f in edited.__struct_fields__},
                                     "labels": LabelSet.of(edited="yes")})
            assert (await conn.apply(edited)).status == Status.OK
            after = await until(lambda: (v := counted()) is not None and v > before and v,
                                30, "the edit reconciled")
        finally:
            await conn.close()
        # The edited journal (and perhaps a deferred one), never all 120 again.
        assert after - before <= 10, (before, after)
    finally:
        c.stop_all()
