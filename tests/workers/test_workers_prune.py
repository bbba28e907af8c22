"""Pruning by retention with a real worker on the `prune` queue, real etcd and S3."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import msgspec

from fragment_store import CoverSet, fragment_key
from protocol import FragmentSpec, JournalSpec
from tools.services import wait_for

from .test_workers_index import put_fragment, s3_store
from .workers_support import put_keys, s3_url


def put_retained_journal(etcd, root: str, name: str, store_url: str, retention: float) -> None:  # type: ignore[no-untyped-def]
    spec = JournalSpec(name=name, replication=1, fragment=FragmentSpec(
        length=1 << 20, compression_codec="gzip", stores=(store_url,), retention=retention))
    spec.validate()
    put_keys(etcd, {f"{root}/journals/{name}": msgspec.json.encode(spec)})


def run(client, journal: str, dry_run: bool = False) -> dict:  # type: ignore[no-untyped-def,type-arg]
    return client.send_task("workers.prune.prune_journal", args=[journal, dry_run],
                            queue="prune").get(timeout=60)


def test_old_fragments_go_young_and_head_stay_dry_run_lists_the_same(
        start_worker, client, etcd, etcd_root, s3, s3_bucket, redis_db) -> None:
    url = s3_url(s3_bucket, "pr/")
    store = s3_store(s3, url)
    j, all_old = "acme/pruned", "acme/all-old"
    old = [put_fragment(store, j, b, bytes([65 + i]) * 100) for i, b in enumerate((0, 100, 200))]
    only = [put_fragment(store, all_old, b, b"z" * 50) for b in (0, 50)]
    oldest_age = max(f.mod_time for f in old + only)
    wait_for(lambda: time.time() > oldest_age + 2.5, timeout=10, what="the old fragments to age")
    young = put_fragment(store, j, 300, b"y" * 100)
    for name in (j, all_old):
        put_retained_journal(etcd, etcd_root, name, url, retention=2.0)
    start_worker(queues=("prune", "index"))

    dry = run(client, j, dry_run=True)
    assert [r["key"] for r in dry["removed"]] == [fragment_key(f) for f in old]
    assert all(store.exists(fragment_key(f)) for f in old)  # dry-run removes nothing

    real = run(client, j)
    assert real["removed"] == dry["removed"] and real["first_retained"] == 300
    assert [i.key for i in store.list(j + "/")] == [fragment_key(young)]
    cover = CoverSet.from_json(redis_db.client.get(f"quire:index:{j}"), j)
    assert [(f.begin, f.end) for f in cover] == [(300, 400)]  # gone from the index too

    # Every fragment of this journal is old: the one holding the head stays.
    assert [r["end"] for r in run(client, all_old)["removed"]] == [50]
    assert [i.key for i in store.list(all_old + "/")] == [fragment_key(only[1])]


def test_guard_offset_bounds_pruning_and_two_runs_at_once_both_succeed(
        start_worker, client, etcd, etcd_root, s3, s3_bucket) -> None:
    url = s3_url(s3_bucket, "guard/")
    store = s3_store(s3, url)
    j = "acme/guarded"
    frags = [put_fragment(store, j, b, b"g" * 10) for b in range(0, 100, 10)]
    newest = max(f.mod_time for f in frags)
    wait_for(lambda: time.time() > newest + 2.5, timeout=10, what="the fragments to age")
    put_retained_journal(etcd, etcd_root, j, url, retention=2.0)
    put_keys(etcd, {f"{etcd_root}/guards/{j}": b"30"})
    start_worker(queues=("prune", "index"), concurrency=2)

    assert [r["end"] for r in run(client, j)["removed"]] == [10, 20, 30]
    assert [i.key for i in store.list(j + "/")] == [fragment_key(f) for f in frags[3:]]

    put_keys(etcd, {f"{etcd_root}/guards/{j}": b"1000"})
    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(lambda _: run(client, j), range(2))  # .get() raises on any error
    assert {r["end"] for r in a["removed"] + b["removed"]} == {40, 50, 60, 70, 80, 90}
    assert [i.key for i in store.list(j + "/")] == [fragment_key(frags[-1])]


def test_beat_prunes_journals_with_a_retention_and_leaves_the_rest(
        start_worker, env, etcd, etcd_root, s3, s3_bucket, tmp_path) -> None:
    import sys
    import uuid

    from tools.services import Service

    url = s3_url(s3_bucket, "beat/")
    store = s3_store(s3, url)
    kept, pruned = "acme/keeps-forever", "acme/retained"
    frags = {n: [put_fragment(store, n, b, b"b" * 10) for b in (0, 10)] for n in (kept, pruned)}
    newest = max(f.mod_time for fs in frags.values() for f in fs)
    wait_for(lambda: time.time() > newest + 2.5, timeout=10, what="the fragments to age")
    put_retained_journal(etcd, etcd_root, kept, url, retention=0.0)
    put_retained_journal(etcd, etcd_root, pruned, url, retention=2.0)
    start_worker(queues=("prune", "index"), QUIRE_WORKER_PRUNE_INTERVAL="0.5")
    beat = Service(f"beat-{uuid.uuid4().hex[:6]}", [
        sys.executable, "-m", "celery", "-A", "workers.app", "beat",
        "-s", str(tmp_path / "beat-schedule"), "--loglevel", "INFO"],
        env={**env, "QUIRE_WORKER_PRUNE_INTERVAL": "0.5"})
    beat.start()
    try:
        wait_for(lambda: len(list(store.list(pruned + "/"))) == 1, timeout=30,
                 what="beat to prune the retained journal")
    finally:
        beat.close()
    assert [i.key for i in store.list(pruned + "/")] == [fragment_key(frags[pruned][1])]
    assert len(list(store.list(kept + "/"))) == 2  # retention 0 keeps forever


def test_index_refresh_exports_storage_gauges(start_worker, client, etcd, etcd_root, s3,
                                              s3_bucket, redis_db) -> None:
    from tools.services import free_port

    from .workers_support import scrape

    url = s3_url(s3_bucket, "gauges/")
    store = s3_store(s3, url)
    j = "acme/accounted"
    frags = [put_fragment(store, j, b, b"q" * 1000) for b in (0, 1000)]
    put_retained_journal(etcd, etcd_root, j, url, retention=0.0)
    port = free_port()
    start_worker(queues=("index",), QUIRE_WORKER_METRICS_PORT=str(port))
    client.send_task("workers.index.refresh_journal", args=[j], queue="index")
    label = f'{{journal="{j}"}}'
    wait_for(lambda: scrape(port, "quire_journal_fragments").get(label) == 2, timeout=30,
             what="the storage gauges")
    stored = sum(store.stat(fragment_key(f)).size for f in frags)
    assert scrape(port, "quire_journal_stored_bytes")[label] == stored
    oldest = min(store.stat(fragment_key(f)).mod_time for f in frags)
    assert scrape(port, "quire_journal_oldest_fragment_timestamp_seconds")[label] == oldest
    # The same figures for the live dashboard, in Redis beside the index.
    from fragment_store.index_keys import STATS_KEY, decode_stats

    wait_for(lambda: redis_db.client.hget(STATS_KEY, j) is not None, timeout=10,
             what="the stats in Redis")
    stats = decode_stats(redis_db.client.hget(STATS_KEY, j))
    assert (stats.fragments, stats.stored_bytes, stats.oldest, stats.begin, stats.end) == (
        2, stored, oldest, 0, 2000)


def test_recovery_log_is_pruned_below_its_snapshot_guard_without_a_retention(
        start_worker, client, etcd, etcd_root, s3, s3_bucket) -> None:
    from protocol import LabelSet
    from protocol.labels import CONTENT_TYPE, RECOVERY_LOG

    url = s3_url(s3_bucket, "rlog/")
    store = s3_store(s3, url)
    log_j, plain = "recovery/counts/shard-000", "acme/not-a-log"
    frags = {n: [put_fragment(store, n, b, b"r" * 10) for b in range(0, 50, 10)]
             for n in (log_j, plain)}
    for name, labels in ((log_j, LabelSet.of(**{CONTENT_TYPE: RECOVERY_LOG})),
                         (plain, LabelSet())):
        spec = JournalSpec(name=name, replication=1, labels=labels, fragment=FragmentSpec(
            length=1 << 20, compression_codec="gzip", stores=(url,)))  # retention 0
        spec.validate()
        put_keys(etcd, {f"{etcd_root}/journals/{name}": msgspec.json.encode(spec),
                        f"{etcd_root}/guards/{name}": b"30"})
    start_worker(queues=("prune", "index"))

    # Fresh fragments, no retention: the log loses all its newest snapshot covers.
    assert [r["end"] for r in run(client, log_j)["removed"]] == [10, 20, 30]
    assert [i.key for i in store.list(log_j + "/")] == [fragment_key(f) for f in frags[log_j][3:]]
    assert run(client, plain)["removed"] == []  # an ordinary journal keeps forever
    assert len(list(store.list(plain + "/"))) == 5
