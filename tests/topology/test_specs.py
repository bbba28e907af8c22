"""Apply / List of journal specs against a real etcd."""

from __future__ import annotations

import asyncio
import json

import aetcd
import pytest

from topology.etcd import journal_key
from coordinator.specs import apply_specs, list_specs
from protocol import JournalSpec, LabelSet, ValidationError, parse_selector
from protocol.errors import EtcdTransactionFailed
from protocol.messages import ApplyChange


def spec(name: str, **labels: str) -> JournalSpec:
    return JournalSpec(name=name, replication=3, labels=LabelSet.of(labels))


async def test_create_update_delete(client: aetcd.Client, etcd_root: str) -> None:
    rev = await apply_specs(client, etcd_root, [ApplyChange(upsert=spec("logs/a", topic="x"))])
    raw = await client.get(journal_key(etcd_root, "logs/a").encode())
    assert json.loads(raw.value)["name"] == "logs/a"  # plain JSON, readable with etcdctl
    assert raw.mod_revision == rev
    with pytest.raises(EtcdTransactionFailed):  # 0 = must not exist
        await apply_specs(client, etcd_root, [ApplyChange(upsert=spec("logs/a"))])
    rev2 = await apply_specs(client, etcd_root,
                             [ApplyChange(upsert=spec("logs/a", topic="y"), expect_mod_revision=rev)])
    with pytest.raises(EtcdTransactionFailed):  # stale revision
        await apply_specs(client, etcd_root, [ApplyChange(delete="logs/a", expect_mod_revision=rev)])
    await apply_specs(client, etcd_root, [ApplyChange(delete="logs/a", expect_mod_revision=rev2)])
    assert await list_specs(client, etcd_root) == []


async def test_validation_happens_before_any_write(client: aetcd.Client, etcd_root: str) -> None:
    bad = JournalSpec(name="bad/../name")
    with pytest.raises(ValidationError, match=r"changes\[1\]"):
        await apply_specs(client, etcd_root, [ApplyChange(upsert=spec("logs/ok")),
                                              ApplyChange(upsert=bad)])
    with pytest.raises(ValidationError):
        await apply_specs(client, etcd_root, [ApplyChange(upsert=spec("logs/x")),
                                              ApplyChange(delete="logs/x", expect_mod_revision=-1)])
    assert await list_specs(client, etcd_root) == []


async def test_all_or_nothing(client: aetcd.Client, etcd_root: str) -> None:
    await apply_specs(client, etcd_root, [ApplyChange(upsert=spec("logs/a"))])
    with pytest.raises(EtcdTransactionFailed):
        await apply_specs(client, etcd_root, [ApplyChange(upsert=spec("logs/b")),
                                              ApplyChange(upsert=spec("logs/a"))])
    assert [e.spec.name for e in await list_specs(client, etcd_root)] == ["logs/a"]


async def test_concurrent_applies_with_the_same_revision(client: aetcd.Client,
                                                         etcd_root: str) -> None:
    rev = await apply_specs(client, etcd_root, [ApplyChange(upsert=spec("logs/a"))])

    async def edit(topic: str) -> int | Exception:
        try:
            return await apply_specs(client, etcd_root, [ApplyChange(
                upsert=spec("logs/a", topic=topic), expect_mod_revision=rev)])
        except EtcdTransactionFailed as exc:
            return exc

    results = await asyncio.gather(*(edit(f"t{i}") for i in range(8)))
    assert sum(isinstance(r, int) for r in results) == 1
    assert sum(isinstance(r, EtcdTransactionFailed) for r in results) == 7


async def test_list_with_selector(client: aetcd.Client, etcd_root: str) -> None:
    await apply_specs(client, etcd_root, [
        ApplyChange(upsert=spec("logs/eu/a", region="eu")),
        ApplyChange(upsert=spec("logs/us/b", region="us")),
        ApplyChange(upsert=spec("metrics/c", region="eu")),
    ])
    names = lambda entries: [e.spec.name for e in entries]  # noqa: E731
    assert names(await list_specs(client, etcd_root, parse_selector("region=eu"))) == \
        ["logs/eu/a", "metrics/c"]
    assert names(await list_specs(client, etcd_root, parse_selector("prefix=logs/"))) == \
        ["logs/eu/a", "logs/us/b"]
    assert names(await list_specs(client, etcd_root, parse_selector("name=metrics/c"))) == \
        ["metrics/c"]
