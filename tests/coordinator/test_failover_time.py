"""How long a primary kill stops appends, and where the time goes (issue #21).

4 coordinators with lease TTL 5 s (the chaos harness's), an R=3 journal, a writer
appending through `quire.client` all along. `kill -9` the primary, then time each
phase from etcd and the writer:

    kill → member key gone (lease expired in etcd) → new route advertised
         → first acknowledgement of an append invoked after the kill

and require the last within lease TTL + 2 s. Waits are bounded, on conditions.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time

import pytest

from protocol import ProcessId
from quire.client import Client
from topology.etcd import connect, member_key

from .cluster import Cluster, journal_route, running, serve_journal
from .test_control_plane_faults import J, Writer

pytestmark = pytest.mark.timeout(120)

TTL = 5.0


@pytest.fixture
def cluster4(etcd, etcd_root):
    # A spare: the journal needs 3 live members after the kill.
    with running(etcd.url, etcd_root, 4, ["--lease-ttl", str(int(TTL))], prefix="fo") as c:
        yield c


async def _poll(pred, timeout: float, step: float = 0.02) -> float:
    """Time at which `pred` (async) first held; bounded (another process's state)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            if await pred():
                return time.monotonic()
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(step)


async def test_appends_resume_within_ttl_plus_2s_after_a_primary_kill(cluster4: Cluster, etcd) -> None:
    c = cluster4
    await serve_journal(c, J)
    etcd_client = await connect(etcd.url)
    client = Client([n.endpoint for n in c.nodes], retry_timeout=30.0)
    writer = Writer(client)
    task = asyncio.create_task(writer.run())
    try:
        await writer.acks_after(time.monotonic(), 10.0)
        route = await journal_route(c.nodes[0].endpoint, J)
        victim: ProcessId = route.members[route.primary]
        node = next(n for n in c.nodes if n.suffix == victim.suffix)
        key = member_key(c.root, victim).encode()
        prefix = f"{c.root}/assign/{J}#".encode()

        async def key_gone() -> bool:
            return await etcd_client.get(key) is None

        async def new_route() -> bool:
            kvs = list((await etcd_client.get_prefix(prefix)).kvs)
            values = {kv.value for kv in kvs}
            return (not any(f"#{victim.zone}#{victim.suffix}#".encode() in kv.key for kv in kvs)
                    and len(values) == 1 and values != {b"{}"})

        t0 = time.monotonic()
        c.kill(node, signal.SIGKILL)
        acked = asyncio.create_task(writer.acks_after(t0, TTL + 10))
        t_expired = await _poll(key_gone, TTL + 5)
        t_route = await _poll(new_route, TTL + 5)
        t_ack = await acked
        print(f"primary kill (lease TTL {TTL:.0f}s): member key gone after {t_expired - t0:.2f}s, "
              f"new route advertised after {t_route - t0:.2f}s, first acknowledged append "
              f"after {t_ack - t0:.2f}s")
        assert t_ack - t0 <= TTL + 2.0, f"appends resumed after {t_ack - t0:.2f}s"
    finally:
        writer.stop.set()
        await asyncio.wait_for(task, 40)
        await client.close()
        await etcd_client.close()
