"""The live dashboard's storage column: /api/state joins the index workers' per-journal
stats from a real Redis (written by workers/index.py) with the specs in a real etcd."""

from __future__ import annotations

import msgspec
import pytest

from dashboards.state import StateCollector
from fragment_store.index_keys import STATS_KEY, decode_stats, encode_stats
from fragment_store.stats import StoreStats
from protocol import FragmentSpec, JournalSpec
from tests.workers.workers_support import put_keys

pytestmark = pytest.mark.timeout(60)


@pytest.mark.asyncio(loop_scope="session")
async def test_state_shows_each_journals_stored_bytes_and_names_bad_entries(
        etcd, etcd_root, redis_db) -> None:  # type: ignore[no-untyped-def]
    names = ("acme/stored", "acme/not-refreshed", "acme/garbled")
    put_keys(etcd, {f"{etcd_root}/journals/{n}": msgspec.json.encode(JournalSpec(
        name=n, replication=1, fragment=FragmentSpec(length=1 << 20))) for n in names})
    stats = StoreStats(fragments=3, stored_bytes=12_345, oldest=1_700_000_000,
                       newest=1_700_000_100, begin=0, end=40_000)
    redis_db.client.hset(STATS_KEY, mapping={names[0]: encode_stats(stats),
                                             names[2]: b'{"fragments": "many"}'})
    collector = StateCollector(etcd.url, etcd_root, timeout=2.0, redis_url=redis_db.url)
    try:
        state = await collector.snapshot()
    finally:
        await collector.close()
    by_name = {j["name"]: j for j in state["journals"]}
    assert by_name[names[0]]["storage"] == stats._asdict()
    assert by_name[names[1]]["storage"] is None and by_name[names[2]]["storage"] is None
    redis_errors = [e for e in state["errors"] if e.startswith("redis:")]
    assert len(redis_errors) == 1, state["errors"]
    assert redis_errors[0].startswith(
        "redis: storage stats of acme/garbled: malformed journal stats"), redis_errors


@pytest.mark.asyncio(loop_scope="session")
async def test_without_redis_there_is_no_storage_column_and_a_dead_redis_is_an_error(
        etcd, etcd_root) -> None:  # type: ignore[no-untyped-def]
    from tools.services import free_port

    put_keys(etcd, {f"{etcd_root}/journals/acme/x": msgspec.json.encode(JournalSpec(
        name="acme/x", replication=1, fragment=FragmentSpec(length=1 << 20)))})
    plain = StateCollector(etcd.url, etcd_root, timeout=1.0)
    dead = StateCollector(etcd.url, etcd_root, timeout=1.0,
                          redis_url=f"redis://127.0.0.1:{free_port()}/0")
    try:
        a, b = await plain.snapshot(), await dead.snapshot()
    finally:
        await plain.close()
        await dead.close()
    assert [j["storage"] for j in a["journals"]] == [None]
    assert not [e for e in a["errors"] if e.startswith("redis")]
    assert [j["storage"] for j in b["journals"]] == [None]  # the rest still renders
    redis_errors = [e for e in b["errors"] if e.startswith("redis:")]
    assert len(redis_errors) == 1 and redis_errors[0].startswith("redis: storage stats: "), \
        b["errors"]
    assert "Error" in redis_errors[0] or "timed out" in redis_errors[0], redis_errors


def test_stats_round_trip_and_refuse_garbage() -> None:
    s = StoreStats(1, 2, 3, 4, 5, 6)
    assert decode_stats(encode_stats(s)) == s
    with pytest.raises(ValueError, match="malformed journal stats"):
        decode_stats(b"[1, 2]")
