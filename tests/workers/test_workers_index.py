"""Index refresh and the beat sweep, with real worker and beat processes."""

from __future__ import annotations

import hashlib
import sys
import threading
import time
import uuid

import pytest

from fragment_store import CoverSet, open_store, persist_fragment, read_manifest
from fragment_store.index_keys import decode_stats
from fragment_store.persist import store_stats
from protocol import Fragment, LabelSet, parse_selector
from tools.services import S3Service, Service, wait_for

from .workers_support import delete_key, put_journal, s3_url


def s3_store(s3: S3Service, url: str):
    return open_store(url, endpoint=s3.url, access_key=s3.access_key,
                      secret_key=s3.secret_key, region=s3.region)


def put_fragment(store, journal: str, begin: int, data: bytes, codec: str = "gzip") -> Fragment:
    f = Fragment(journal=journal, begin=begin, end=begin + len(data),
                 sum=hashlib.sha1(data).hexdigest(), codec=codec)
    return persist_fragment(store, f, data)


class Updates:
    """Collects `quire:index-updates` messages on a real subscription."""

    def __init__(self, client) -> None:
        self.pubsub = client.pubsub(ignore_subscribe_messages=True)
        self.pubsub.subscribe("quire:index-updates")
        self.seen: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            msg = self.pubsub.get_message(timeout=0.2)
            if msg and msg["type"] == "message":
                self.seen.append(msg["data"].decode())

    def count(self, journal: str) -> int:
        return self.seen.count(journal)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.pubsub.close()


def flush(client, updates: Updates) -> None:
    """Every update published before this call has been seen by `updates`."""
    marker = f"flush-{uuid.uuid4().hex[:8]}"
    client.publish("quire:index-updates", marker)
    wait_for(lambda: updates.count(marker) >= 1, timeout=10, what="our own marker message")


@pytest.fixture
def updates(redis_db):
    u = Updates(redis_db.client)
    yield u
    u.close()


def test_refresh_publishes_covering_set_and_manifest(
        start_worker, client, etcd, etcd_root, s3, s3_bucket, redis_db, updates) -> None:
    url = s3_url(s3_bucket, "p/")
    store = s3_store(s3, url)
    j = "acme/index-test"
    a = put_fragment(store, j, 0, b"a" * 100)
    put_fragment(store, j, 0, b"a" * 40)  # covered by a
    c = put_fragment(store, j, 100, b"c" * 50)
    put_journal(etcd, etcd_root, j, stores=(url,))
    start_worker(queues=("index",))

    client.send_task("workers.index.refresh_journal", args=[j], queue="index")
    wait_for(lambda: updates.count(j) >= 1, timeout=30, what="an index update")

    raw = redis_db.client.get(f"quire:index:{j}")
    cover = CoverSet.from_json(raw, j)
    assert [(f.begin, f.end, f.sum) for f in cover] == [(0, 100, a.sum), (100, 150, c.sum)]
    assert all(f.backing_store == url and f.mod_time > 0 for f in cover)
    assert float(redis_db.client.hget("quire:index-refreshed", j)) > time.time() - 60
    manifest = read_manifest(store, j)
    assert manifest.fragments == tuple(cover) and manifest.end_offset == 150


def test_manifest_carries_the_spec_labels(
        start_worker, client, etcd, etcd_root, file_store, redis_db, updates) -> None:
    """Batch readers select journals by label from the store alone (spark/catalog.py)."""
    from spark.catalog import store_journals

    j, other = "acme/labelled", "acme/unlabelled"
    store = open_store(file_store)
    put_fragment(store, j, 0, b"l" * 30)
    put_fragment(store, other, 0, b"u" * 30)
    labels = LabelSet.of({"app": "clicks", "region": ["eu", "us"]})
    put_journal(etcd, etcd_root, j, stores=(file_store,), labels=labels)
    put_journal(etcd, etcd_root, other, stores=(file_store,))
    start_worker(queues=("index",))
    for name in (j, other):
        client.send_task("workers.index.refresh_journal", args=[name], queue="index")
    wait_for(lambda: updates.count(j) >= 1 and updates.count(other) >= 1, timeout=30,
             what="both indexes")
    assert read_manifest(store, j).labels == labels
    assert read_manifest(store, other).labels == LabelSet()
    found = store_journals(store, parse_selector("app=clicks"))
    assert found[j] == labels and found[other] == LabelSet()
    assert [n for n, ls in found.items() if parse_selector("app=clicks").matches(ls)] == [j]

    # Same covering set, new labels: the manifest is rewritten for them.
    relabelled = LabelSet.of({"app": "views"})
    put_journal(etcd, etcd_root, j, stores=(file_store,), labels=relabelled)
    client.send_task("workers.index.refresh_journal", args=[j], queue="index")
    wait_for(lambda: updates.count(j) >= 2, timeout=30, what="a second index update")
    assert read_manifest(store, j).labels == relabelled


def test_refresh_of_a_deleted_journal_removes_its_index(
        start_worker, client, etcd, etcd_root, file_store, redis_db, updates) -> None:
    j = "acme/deleted"
    put_journal(etcd, etcd_root, j, stores=(file_store,))
    put_fragment(open_store(file_store), j, 0, b"x" * 10)
    start_worker(queues=("index",))
    client.send_task("workers.index.refresh_journal", args=[j], queue="index")
    wait_for(lambda: redis_db.client.exists(f"quire:index:{j}"), timeout=30, what="the index")

    delete_key(etcd, f"{etcd_root}/journals/{j}")
    client.send_task("workers.index.refresh_journal", args=[j], queue="index")
    wait_for(lambda: updates.count(j) >= 2, timeout=30, what="the removal to be published")
    assert not redis_db.client.exists(f"quire:index:{j}")
    assert not redis_db.client.hexists("quire:index-digests", j)


def test_beat_sweep_honors_each_journal_refresh_interval(
        start_worker, env, etcd, etcd_root, file_store, redis_db, updates, tmp_path) -> None:
    fast, slow = "acme/fast-refresh", "acme/slow-refresh"
    put_journal(etcd, etcd_root, fast, stores=(file_store,), refresh=1.0)
    put_journal(etcd, etcd_root, slow, stores=(file_store,), refresh=3600.0)
    beat_env = {**env, "QUIRE_WORKER_INDEX_SWEEP_INTERVAL": "0.5"}
    start_worker(queues=("index",), QUIRE_WORKER_INDEX_SWEEP_INTERVAL="0.5")
    beat = Service(f"beat-{uuid.uuid4().hex[:6]}", [
        sys.executable, "-m", "celery", "-A", "workers.app", "beat",
        "-s", str(tmp_path / "beat-schedule"), "--loglevel", "INFO"], env=beat_env)
    beat.start()
    stamps: set[bytes] = set()

    def refreshed_again() -> bool:
        stamp = redis_db.client.hget("quire:index-refreshed", fast)
        if stamp is not None:
            stamps.add(stamp)
        return len(stamps) >= 4

    try:
        wait_for(refreshed_again, timeout=30, what="repeated refreshes of the fast journal")
    finally:
        beat.close()
    # One beat entry serves both journals; the slow one was refreshed once, at first sight.
    flush(redis_db.client, updates)
    assert updates.count(slow) == 1
    assert updates.count(fast) == 1  # refreshed 4 times, published once: it never changed


def test_sweep_refreshes_due_journals_in_batches(
        start_worker, client, etcd, etcd_root, file_store, redis_db, updates) -> None:
    """The sweep sends due journals as `refresh_batch` tasks (one topology read each),
    never a `refresh_journal` per journal; every journal's index is published."""
    names = [f"acme/batched-{i}" for i in range(7)]
    store = open_store(file_store)
    for i, name in enumerate(names):
        put_journal(etcd, etcd_root, name, stores=(file_store,))
        put_fragment(store, name, 0, f"content of {i}\n".encode())
    worker = start_worker(queues=("index",))
    client.send_task("workers.index.sweep", queue="index")
    wait_for(lambda: all(updates.count(n) >= 1 for n in names), timeout=60,
             what="every journal's index published")
    for i, name in enumerate(names):
        cover = CoverSet.from_json(redis_db.client.get(f"quire:index:{name}"))
        assert [(f.begin, f.end) for f in cover] == [(0, len(f"content of {i}\n"))]
    text = worker.log_text()
    assert "workers.index.refresh_batch[" in text
    assert "workers.index.refresh_journal[" not in text


def test_an_unchanged_journal_is_stamped_not_published(
        start_worker, client, etcd, etcd_root, file_store, redis_db, updates) -> None:
    """#49: a refresh that finds the store as it was publishes nothing and does not SET
    the index (coordinators would fetch, decode and apply it for nothing), yet stamps
    the refresh; a change is published, with the manifest and stats of that listing."""
    j = "acme/unchanged"
    store = open_store(file_store)
    put_fragment(store, j, 0, b"u" * 50)
    put_journal(etcd, etcd_root, j, stores=(file_store,))
    start_worker(queues=("index",))
    r = redis_db.client
    key = f"quire:index:{j}"

    def stamp() -> float:
        return float(r.hget("quire:index-refreshed", j) or 0)

    client.send_task("workers.index.refresh_journal", args=[j], queue="index")
    wait_for(lambda: updates.count(j) >= 1, timeout=30, what="the first index update")
    assert decode_stats(r.hget("quire:journal-stats", j)) == store_stats(store, j)
    r.expire(key, 3600)  # a SET of the index would clear this
    for task, args in (("workers.index.refresh_journal", [j]),
                       ("workers.index.refresh_batch", [[j]])):
        before = stamp()
        client.send_task(task, args=args, queue="index")
        wait_for(lambda: stamp() > before, timeout=30, what=f"{task} to stamp the journal")
    flush(r, updates)
    assert updates.count(j) == 1
    assert r.ttl(key) > 0

    c = put_fragment(store, j, 50, b"v" * 30)
    client.send_task("workers.index.refresh_batch", args=[[j]], queue="index")
    wait_for(lambda: updates.count(j) >= 2, timeout=30, what="the changed index published")
    assert r.ttl(key) == -1
    cover = CoverSet.from_json(r.get(key), j)
    assert [(f.begin, f.end) for f in cover] == [(0, 50), (50, 80)] and c.sum == cover[-1].sum
    assert read_manifest(store, j).end_offset == 80
    assert decode_stats(r.hget("quire:journal-stats", j)) == store_stats(store, j)
