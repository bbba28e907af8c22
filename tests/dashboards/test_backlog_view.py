"""The live dashboard's backlog column: /api/state joins the primaries' backlog reports and
the workers' persist failures (Redis, fragment_store/persist_status.py) with the specs in
etcd; a stale report (its coordinator gone) is not shown as current."""

from __future__ import annotations

import time

import msgspec
import pytest

from dashboards.state import StateCollector
from fragment_store.persist_status import (
    BACKLOG_KEY,
    FAILURES_KEY,
    PersistBacklog,
    PersistFailure,
)
from protocol import FragmentSpec, JournalSpec
from tests.workers.workers_support import put_keys

pytestmark = pytest.mark.timeout(60)


@pytest.mark.asyncio(loop_scope="session")
async def test_state_shows_backlog_age_and_the_last_persist_failure(
        etcd, etcd_root, redis_db) -> None:  # type: ignore[no-untyped-def]
    names = ("acme/behind", "acme/stored", "acme/stale", "acme/refused")
    put_keys(etcd, {f"{etcd_root}/journals/{n}": msgspec.json.encode(JournalSpec(
        name=n, replication=1, fragment=FragmentSpec(length=1 << 20))) for n in names})
    now = time.time()
    behind = PersistBacklog(bytes=4500, fragments=1, oldest=now - 120, coordinator="z#a",
                            updated=now)
    stale = PersistBacklog(bytes=10, oldest=now - 900, coordinator="z#gone", updated=now - 600)
    refused = PersistFailure(reason="store_not_allowed", message="StoreNotAllowed: no",
                             store="file:///some/dir/", count=3, first=now - 60, last=now - 5)
    redis_db.client.hset(BACKLOG_KEY, mapping={names[0]: msgspec.json.encode(behind),
                                               names[2]: msgspec.json.encode(stale),
                                               names[3]: msgspec.json.encode(behind)})
    redis_db.client.hset(FAILURES_KEY, names[3], msgspec.json.encode(refused))
    collector = StateCollector(etcd.url, etcd_root, timeout=2.0, redis_url=redis_db.url)
    try:
        state = await collector.snapshot()
    finally:
        await collector.close()
    by_name = {j["name"]: j for j in state["journals"]}
    b = by_name[names[0]]["backlog"]
    assert b["bytes"] == 4500 and b["fragments"] == 1 and 119 < b["age"] < 180
    assert by_name[names[0]]["persist_failure"] is None
    assert by_name[names[1]]["backlog"] == {"bytes": 0, "age": 0.0, "fragments": 0}
    assert by_name[names[2]]["backlog"]["bytes"] == 0  # stale: its coordinator is gone
    f = by_name[names[3]]["persist_failure"]
    assert f["reason"] == "store_not_allowed" and f["count"] == 3
    assert f["store"] == "file:///some/dir/"


@pytest.mark.asyncio(loop_scope="session")
async def test_without_redis_the_backlog_is_unknown(etcd, etcd_root) -> None:  # type: ignore[no-untyped-def]
    put_keys(etcd, {f"{etcd_root}/journals/acme/y": msgspec.json.encode(JournalSpec(
        name="acme/y", replication=1, fragment=FragmentSpec(length=1 << 20)))})
    plain = StateCollector(etcd.url, etcd_root, timeout=1.0)
    try:
        state = await plain.snapshot()
    finally:
        await plain.close()
    assert [(j["backlog"], j["persist_failure"]) for j in state["journals"]] == [(None, None)]
