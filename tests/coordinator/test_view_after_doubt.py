"""A coordinator confirmed again after etcd stalled leads again, even when the revision
its standing dates from is a write outside its root (docs/reliability.md, "A current
view"): no event of ours will ever announce that revision, so the coordinator reads its
prefix to catch its mirror up (KeySpace._catch_up) instead of waiting for one.

One etcd shared with another tenant (a key outside our root written last), one
coordinator (lease TTL 6 s), an R=1 journal: etcd is SIGSTOPped until the coordinator
stops leading (its lease unconfirmed), then resumed before etcd could expire the lease.
"""

from __future__ import annotations

import pytest

from protocol import Status
from tools.services import EtcdService
from topology.etcd import connect

from .cluster import Conn, running, serve_journal, until

pytestmark = pytest.mark.timeout(120)

J = "view/j"
OTHER_TENANT_KEY = b"/another-tenant/key"


async def _append(endpoint: str) -> Status:
    conn = await Conn.open(endpoint)
    try:
        return (await conn.append(J, [b"x\n"])).status
    finally:
        await conn.close()


async def test_a_coordinator_leads_again_after_doubt_when_the_last_write_was_another_tenants(
        etcd_root: str) -> None:
    with EtcdService("etcd-view-doubt") as etcd, \
            running(etcd.url, etcd_root, 1, extra=["--lease-ttl", "6"]) as c:
        endpoint = c.nodes[0].endpoint
        await serve_journal(c, J, replication=1)
        other = await connect(etcd.url, timeout=2.0)
        try:
            # The store's latest revision is now another tenant's write.
            await other.put(OTHER_TENANT_KEY, b"1")
            etcd.pause()
            try:
                await until(lambda: _refused(endpoint), 20.0,
                            "the coordinator to stop leading with etcd stopped", interval=0.1)
            finally:
                etcd.resume()
            # Confirmed again (the lease outlived the stall): it must lead again, though
            # nothing under its root was written since the revision its standing dates from.
            await until(lambda: _ok(endpoint), 30.0, f"{endpoint} to lead {J} again after "
                        "etcd's resume", interval=0.1)
        finally:
            await other.close()


async def _refused(endpoint: str) -> bool:
    return await _append(endpoint) != Status.OK


async def _ok(endpoint: str) -> bool:
    return await _append(endpoint) == Status.OK
