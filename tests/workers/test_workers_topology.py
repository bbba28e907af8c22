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
