"""workers.topology reads specs, members and assignments straight from etcd."""

from __future__ import annotations

import msgspec
import pytest

from workers.errors import TopologyUnavailable
from workers.topology import read_journal, read_topology

from .workers_support import put_journal, put_keys


async def test_reads_specs_with_primary_endpoint_first(etcd, etcd_root) -> None:
    put_journal(etcd, etcd_root, "acme/one", endpoints=("127.0.0.1:7001", "127.0.0.1:7002"))
    put_journal(etcd, etcd_root, "acme/one-more", endpoints=("127.0.0.1:7002",))
    put_keys(etcd, {f"{etcd_root}/journals/acme/garbage": b"{not json"})

    topo = await read_topology(etcd.url, etcd_root, timeout=5)
    assert set(topo.journals) == {"acme/one", "acme/one-more"}
    assert topo.journals["acme/one"].endpoints == ("127.0.0.1:7001", "127.0.0.1:7002")

    one = await read_journal(etcd.url, etcd_root, "acme/one", timeout=5)
    assert one is not None and one.primary_endpoint == "127.0.0.1:7001"
    assert one.spec.fragment.length == 1 << 20
    assert await read_journal(etcd.url, etcd_root, "acme/none", timeout=5) is None


async def test_primary_slot_wins_whatever_the_key_order(etcd, etcd_root) -> None:
    put_journal(etcd, etcd_root, "acme/two")
    put_keys(etcd, {
        f"{etcd_root}/members/z#aaaa": msgspec.json.encode({"endpoint": "h:1"}),
        f"{etcd_root}/members/z#bbbb": msgspec.json.encode({"endpoint": "h:2"}),
        f"{etcd_root}/assign/acme/two#z#aaaa#1": b"{}",
        f"{etcd_root}/assign/acme/two#z#bbbb#0": b"{}",
    })
    two = await read_journal(etcd.url, etcd_root, "acme/two", timeout=5)
    assert two is not None and two.endpoints == ("h:2", "h:1")


async def test_unreachable_etcd_is_a_typed_retriable_error() -> None:
    with pytest.raises(TopologyUnavailable) as info:
        await read_topology("http://127.0.0.1:1", "/quire", timeout=2)
    assert info.value.retriable


async def test_read_specs_reads_only_the_journals_asked_for(etcd, etcd_root) -> None:
    """An index `refresh_batch` reads its journals' specs only, a transaction of gets per
    SPEC_TXN journals — not the whole topology per batch (#49)."""
    from workers.topology import SPEC_TXN, read_specs

    names = [f"acme/spec-{i:03d}" for i in range(SPEC_TXN + 5)]
    put_keys(etcd, {f"{etcd_root}/journals/{n}": msgspec.json.encode({"name": n}) for n in names})
    put_journal(etcd, etcd_root, "acme/spec-000-longer")
    put_keys(etcd, {f"{etcd_root}/journals/acme/garbage": b"{not json"})
    asked = [*names[::2], "acme/absent", "acme/garbage"]
    topo = await read_specs(etcd.url, etcd_root, asked, timeout=5)
    assert sorted(topo.journals) == sorted(names[::2])  # no neighbour, absent or garbage
    assert all(t.endpoints == () and t.spec.name == n for n, t in topo.journals.items())
    assert (await read_specs(etcd.url, etcd_root, [], timeout=5)).journals == {}


async def test_specs_alone_without_endpoints(etcd, etcd_root) -> None:
    """The index sweep reads specs alone: no member or assignment is read."""
    put_journal(etcd, etcd_root, "acme/alone", endpoints=("127.0.0.1:7001",))
    topo = await read_topology(etcd.url, etcd_root, timeout=5, endpoints=False)
    assert set(topo.journals) == {"acme/alone"} and topo.journals["acme/alone"].endpoints == ()
    full = await read_topology(etcd.url, etcd_root, timeout=5)
    assert full.journals["acme/alone"].endpoints == ("127.0.0.1:7001",)
