"""`--advertise`: peers and clients reach a coordinator through the endpoint it announces.

Each coordinator sits behind a pass-through proxy and announces the proxy, so the
replication stream between the primary and its peer must cross it (the chaos harness
relies on this to fault peer links).
"""

from __future__ import annotations

import shutil

from chaos.proxy import FaultProxy
from protocol import Status

from .cluster import Cluster, Conn, make_workdir, spec, wait_appendable


async def test_peers_replicate_through_the_advertised_endpoint(etcd, etcd_root) -> None:  # noqa: ANN001
    c = Cluster(etcd.url, etcd_root, make_workdir())
    proxies: list[FaultProxy] = []
    try:
        for i in range(2):
            node = c.add(f"zone-{i}", f"node-{i}")
            proxy = await FaultProxy(f"p{i}", node.endpoint).start()
            proxies.append(proxy)
            c.extra = ["--advertise", proxy.endpoint]
            c.start(node)
        for n in c.nodes:
            await c.wait_listening(n)
        # The client talks to node-0 directly, so bytes through a proxy are peer traffic
        # (appends proxied to the primary, or the primary's replication to its peer).
        conn = await Conn.open(c.nodes[0].endpoint)
        assert (await conn.apply(spec("adv/one", replication=2))).status == Status.OK
        barrier = await wait_appendable(proxies[0].endpoint, "adv/one")
        assert barrier.status == Status.OK, [c.tail(n) for n in c.nodes]
        listing = await conn.list()
        route = next(e.route for e in listing.journals if e.spec.name == "adv/one")

        before = [p.stats.bytes_up for p in proxies]
        r = await conn.append("adv/one", [b"x" * 50_000])
        assert r.status == Status.OK, r
        await conn.close()
        # The primary's replicate stream to its peer carried the 50 kB through the
        # peer's advertised proxy.
        primary = route.members[route.primary].suffix
        peer_proxy = next(p for p, n in zip(proxies, c.nodes) if n.suffix != primary)
        assert peer_proxy.stats.bytes_up - before[proxies.index(peer_proxy)] >= 50_000
        for p in proxies:
            reader = await Conn.open(p.endpoint)
            data, _ = await reader.read("adv/one", r.commit.begin, end_offset=r.commit.end)
            assert data == b"x" * 50_000
            await reader.close()
    finally:
        c.stop_all()
        for p in proxies:
            await p.close()
        shutil.rmtree(c.workdir, ignore_errors=True)


def test_a_wildcard_listen_needs_an_advertised_address() -> None:
    import subprocess
    import sys

    base = [sys.executable, "-m", "coordinator.main", "--zone", "a", "--id", "node-w",
            "--etcd", "http://127.0.0.1:9"]
    out = subprocess.run([*base, "--listen", "0.0.0.0:8080"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "--listen" in out.stderr and "--advertise" in out.stderr
    out = subprocess.run([*base, "--listen", "0.0.0.0:8080", "--advertise", "[::]:8080"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no address peers can dial" in out.stderr
