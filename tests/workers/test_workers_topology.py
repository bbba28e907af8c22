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


async def test_every_spec_alone_is_read_again_only_once_changed(etcd, etcd_root) -> None:
    """The index sweep's read (every spec, no endpoints) costs one key's Range while the
    specs are unchanged (#49: 10,000 specs decoded every 5 s was most of an idle worker);
    a put, a replacement or a delete under journals/ is seen by the next read."""
    from .workers_support import delete_key

    put_journal(etcd, etcd_root, "acme/c-1")
    put_journal(etcd, etcd_root, "acme/c-2")
    first = await read_topology(etcd.url, etcd_root, timeout=5, endpoints=False)
    assert set(first.journals) == {"acme/c-1", "acme/c-2"}
    assert await read_topology(etcd.url, etcd_root, timeout=5, endpoints=False) is first
    put_journal(etcd, etcd_root, "acme/c-2", refresh=30.0)  # replaced: same count
    changed = await read_topology(etcd.url, etcd_root, timeout=5, endpoints=False)
    assert changed is not first
    assert changed.journals["acme/c-2"].spec.fragment.refresh_interval == 30.0
    delete_key(etcd, f"{etcd_root}/journals/acme/c-1")  # deleted: one key fewer
    after = await read_topology(etcd.url, etcd_root, timeout=5, endpoints=False)
    assert set(after.journals) == {"acme/c-2"}
    put_journal(etcd, etcd_root, "acme/c-3")
    assert set((await read_topology(etcd.url, etcd_root, timeout=5,
                                    endpoints=False)).journals) == {"acme/c-2", "acme/c-3"}
    # With endpoints (the pulse sweep), never the cached read.
    full = await read_topology(etcd.url, etcd_root, timeout=5)
    assert set(full.journals) == {"acme/c-2", "acme/c-3"}
