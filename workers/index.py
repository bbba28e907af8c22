"""Index refresh: list the store, publish the covering set (queue `index`).

`refresh_journal(journal)`:

1. read the journal's spec from etcd (a deleted journal: its Redis index is removed
   and an update published, so coordinators forget it);
2. list every store of the spec, once each: the fragments and the storage stats come
   from the same listing — the store is authoritative; any store error fails the
   refresh, which is retried (a partial listing would hide fragments);
3. build the covering set (fragment_store.index.CoverSet) and a digest of all a
   publish writes (covering set, labels, stores, stats);
4. if that digest is the one last published (hash `quire:index-digests`, read for a
   whole `refresh_batch` in one HMGET) and less than REPUBLISH_AFTER ago, the journal
   is unchanged: only `HSET quire:index-refreshed <journal> <unix time>` (the store was
   looked at; one HSET for a batch's unchanged journals) — no manifest read, no SET, no PUBLISH, so an idle journal costs its
   listing and a few Redis round trips, and coordinators nothing (#49). Otherwise:
5. write the manifest `.quire/index/<journal>/manifest.json` into stores[0] for
   batch readers — the covering set and the spec's labels, so they select journals by
   label from the store alone — unless it already holds the same of both;
6. in one Redis transaction: `SET quire:index:<journal>` (JSON list of Fragment),
   `HSET quire:index-refreshed <journal> <unix time>`, `HSET quire:journal-stats
   <journal> <StoreStats JSON>` (fragments, stored bytes, oldest/newest, offsets: the
   live dashboard's storage columns), `HSET quire:index-digests <journal> "<digest>
   <unix time>"` and `PUBLISH quire:index-updates <journal>`; coordinators
   (coordinator/index_watch.py) merge it, drop local fragments it covers and check
   INDEX_HAS_GREATER_OFFSET (they read `quire:index-refreshed` themselves now and then
   for `quire_index_age_seconds`, as an unchanged journal publishes nothing);
7. either way, raise the watermark (workers/watermark.py `advance`).

`sweep()` (beat, every `QUIRE_WORKER_INDEX_SWEEP_INTERVAL`): reads all specs once
and enqueues the journals whose own `fragment.refresh_interval` has passed since
their last refresh or enqueue (hash `quire:index-enqueued`), so beat's schedule stays
a fixed handful of entries however many journals exist. Due journals go out as
`refresh_batch` tasks of up to REFRESH_BATCH journals: one etcd connection per batch,
reading only the batch's specs (`read_specs`: a transaction of gets per 100 journals —
not the whole topology, 40,000 keys at 10,000 journals, per batch of 200), not an etcd
connection and three reads per journal (#49); a journal whose
refresh in a batch failed gets its own `refresh_journal` (with its retries).
`refresh_journal` stays the one-journal form (persist tasks send it).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable
from typing import Any

import msgspec

from fragment_store import (
    CoverSet,
    FragmentNotFound,
    StoreUnavailable,
    list_fragments_stats,
    read_manifest,
    write_manifest,
)
from fragment_store.index_keys import (
    DIGESTS_KEY,
    ENQUEUED_KEY,
    INDEX_CHANNEL,
    INDEX_KEY_PREFIX,
    REFRESHED_KEY,
    STATS_KEY,
    encode_stats,
)
from fragment_store.stats import EMPTY, StoreStats, add
from protocol.logs import bind, get_logger
from protocol import LabelSet
from workers import common, metrics, watermark
from workers.app import app
from workers.errors import MAINTENANCE_RETRY, RETRIABLE
from workers.topology import Topology, read_specs_sync, read_topology_sync

__all__ = ["DIGESTS_KEY", "ENQUEUED_KEY", "INDEX_CHANNEL", "INDEX_KEY_PREFIX", "REFRESHED_KEY",
           "REFRESH_BATCH", "REPUBLISH_AFTER", "publish_index", "refresh", "refresh_batch",
           "refresh_journal", "sweep"]

log = get_logger(__name__)


_RETRY_ON = (*RETRIABLE, StoreUnavailable)

REFRESH_BATCH = 200
"""Most journals of one `refresh_batch` task."""

REPUBLISH_AFTER = 3600.0
"""Seconds after which an unchanged journal is published in full again (manifest
checked, index SET, update published): whatever was lost out of band — a manifest
removed by hand, an index key evicted — heals within this bound."""

_READ = object()
"""`refresh(known=...)` default: read the journal's digest from Redis."""


def publish_index(journal: str, cover: CoverSet | None, now: float | None = None,
                  stats: StoreStats | None = None, digest: str | None = None) -> None:
    """Store and announce a journal's index (and its storage stats, for the dashboard);
    `None` removes it (journal deleted). `digest`: what the refresh computed of it
    (kept in `quire:index-digests`); without one the next refresh publishes again."""
    now = time.time() if now is None else now
    pipe = common.redis_client().pipeline(transaction=True)
    if cover is None:
        pipe.delete(INDEX_KEY_PREFIX + journal)
        for key in (REFRESHED_KEY, ENQUEUED_KEY, STATS_KEY, DIGESTS_KEY):
            pipe.hdel(key, journal)
    else:
        pipe.set(INDEX_KEY_PREFIX + journal, cover.to_json())
        pipe.hset(REFRESHED_KEY, journal, f"{now:.3f}")
        if stats is not None:
            pipe.hset(STATS_KEY, journal, encode_stats(stats))
        if digest is not None:
            pipe.hset(DIGESTS_KEY, journal, f"{digest} {now:.3f}")
        else:
            pipe.hdel(DIGESTS_KEY, journal)
    pipe.publish(INDEX_CHANNEL, journal)
    pipe.execute()


def _digest(cover: CoverSet, labels: LabelSet, stores: Iterable[str], stats: StoreStats) -> str:
    """Of everything a publish writes: the covering set (the index), the labels and the
    manifest's store (the manifest), the stats (the stats hash)."""
    h = hashlib.blake2b(digest_size=16)
    for part in (cover.to_json(), msgspec.json.encode(labels), "\n".join(stores).encode(),
                 encode_stats(stats)):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()


def _unchanged(known: Any, digest: str, now: float) -> bool:
    """Whether `known` (the journal's DIGESTS_KEY entry) says `digest` was published
    less than REPUBLISH_AFTER ago."""
    if not known:
        return False
    text = known.decode() if isinstance(known, bytes) else str(known)
    old, _, at = text.partition(" ")
    try:
        return old == digest and 0 <= now - float(at) < REPUBLISH_AFTER
    except ValueError:
        return False


def _write_manifest(store_url: str, journal: str, cover: CoverSet, labels: LabelSet) -> bool:
    st = common.store(store_url)
    try:
        old = read_manifest(st, journal)
        if old.fragments == tuple(cover) and old.labels == labels:
            return False
    except FragmentNotFound:
        pass
    except Exception as exc:  # noqa: BLE001 - a corrupt manifest is simply rewritten
        log.warning("rewriting an unreadable manifest", error=str(exc))
    write_manifest(st, journal, cover, labels=labels)
    return True


def _export_stats(journal: str, total: StoreStats) -> None:
    """Storage gauges (quire_journal_*)."""
    metrics.JOURNAL_FRAGMENTS.labels(journal).set(total.fragments)
    metrics.JOURNAL_STORED_BYTES.labels(journal).set(total.stored_bytes)
    metrics.JOURNAL_OLDEST_FRAGMENT.labels(journal).set(total.oldest)


def refresh(journal: str, topo: Topology | None = None, known: Any = _READ,
            stamps: dict[str, str] | None = None) -> dict[str, Any]:
    """The task body, callable without Celery; `topo`: a topology read just now (a
    batch's), else the journal's own is read; `known`: the journal's DIGESTS_KEY entry
    read just now (a batch's), else it is read here; `stamps`: where an unchanged
    journal's refresh stamp goes (a batch writes them all at once), else it is written."""
    ws = common.worker_settings()
    s = common.settings()
    started = time.monotonic()
    if topo is None:
        topo = read_topology_sync(s.etcd_url, s.etcd_root, timeout=ws.io_timeout,
                                  journal=journal)
    jt = topo.journals.get(journal)
    if jt is None:
        publish_index(journal, None)
        watermark.forget(journal)
        for gauge in metrics.STORAGE_GAUGES:
            try:
                gauge.remove(journal)
            except KeyError:
                pass
        log.info("journal has no spec; its index was removed")
        return {"journal": journal, "fragments": 0, "deleted": True}
    stores = jt.spec.fragment.stores
    listed = []
    stats = EMPTY
    for url in stores:  # one listing per store: the fragments and the stats
        fragments, st = list_fragments_stats(common.store(url), journal)
        listed.extend(fragments)
        stats = add(stats, st)
    cover = CoverSet(listed)
    _export_stats(journal, stats)
    digest = _digest(cover, jt.spec.labels, stores, stats)
    r = common.redis_client()
    if known is _READ:
        known = r.hget(DIGESTS_KEY, journal)
    now = time.time()
    published = not _unchanged(known, digest, now)
    wrote = False
    if published:
        # Manifest first: once coordinators hear of an index, batch readers see it too.
        wrote = _write_manifest(stores[0], journal, cover, jt.spec.labels) if stores else False
        publish_index(journal, cover, now, stats=stats, digest=digest)
    else:
        # Nothing to announce: only say the store was looked at (the sweep's due time,
        # the coordinators' quire_index_age_seconds, the dashboard).
        if stamps is not None:
            stamps[journal] = f"{now:.3f}"
        else:
            r.hset(REFRESHED_KEY, journal, f"{now:.3f}")
    watermark.advance(journal, cover)  # after the publish: readers see the index first
    metrics.INDEX_REFRESH_SECONDS.observe(time.monotonic() - started)
    (log.info if published else log.debug)(
        "index refreshed", fragments=len(cover), end_offset=cover.end_offset,
        published=published, manifest_written=wrote)
    return {"journal": journal, "fragments": len(cover), "end_offset": cover.end_offset,
            "published": published}


@app.task(name="workers.index.refresh_journal", bind=True, ignore_result=True,
          autoretry_for=_RETRY_ON, retry_backoff=True, retry_backoff_max=60,
          retry_jitter=True, max_retries=5)
def refresh_journal(self: Any, journal: str) -> dict[str, Any]:
    with bind(journal=journal, task_id=self.request.id):
        return refresh(journal)


@app.task(name="workers.index.refresh_batch", bind=True, ignore_result=True,
          **MAINTENANCE_RETRY)
def refresh_batch(self: Any, journals: list[str]) -> dict[str, Any]:
    """Refresh `journals` against one read of their specs (a transaction per SPEC_TXN)
    and one of their digests; a journal whose refresh failed is sent again alone, as `refresh_journal`
    (its own retries)."""
    ws, s = common.worker_settings(), common.settings()
    topo = read_specs_sync(s.etcd_url, s.etcd_root, journals, timeout=ws.io_timeout)
    digests = common.redis_client().hmget(DIGESTS_KEY, journals) if journals else []
    failed: list[str] = []
    stamps: dict[str, str] = {}
    published = 0
    try:
        for journal, known in zip(journals, digests, strict=True):
            with bind(journal=journal, task_id=self.request.id):
                try:
                    published += bool(refresh(journal, topo, known, stamps).get("published", True))
                except Exception as exc:  # noqa: BLE001 - retried alone
                    log.warning("index refresh failed; retrying it alone", error=repr(exc))
                    failed.append(journal)
    finally:
        if stamps:  # the unchanged journals' stamps, in one HSET
            common.redis_client().hset(REFRESHED_KEY, mapping={j: t for j, t in stamps.items()})
    for journal in failed:
        refresh_journal.apply_async(args=[journal])
    log.info("index batch refreshed", journals=len(journals), published=published,
             failed=len(failed))
    return {"journals": len(journals), "published": published, "failed": len(failed)}


@app.task(name="workers.index.sweep", bind=True, ignore_result=True,
          **MAINTENANCE_RETRY)
def sweep(self: Any) -> int:
    ws = common.worker_settings()
    # Specs alone: the sweep needs names and refresh intervals, not the members and
    # assignments (3 keys of 4 at R=3) — read every QUIRE_WORKER_INDEX_SWEEP_INTERVAL.
    with common.sweep_topology("index", ws.index_sweep_interval, endpoints=False) as topo:
        if topo is None:
            log.info("another index sweep is running; skipping")
            return 0
        r = common.redis_client()
        refreshed = {k.decode(): float(v) for k, v in r.hgetall(REFRESHED_KEY).items()}
        enqueued = {k.decode(): float(v) for k, v in r.hgetall(ENQUEUED_KEY).items()}
        now = time.time()
        due: list[tuple[str, float]] = []
        for name, jt in sorted(topo.journals.items()):
            interval = jt.spec.fragment.refresh_interval
            last = max(refreshed.get(name, 0.0), enqueued.get(name, 0.0))
            if now - last >= interval:
                due.append((name, interval))
        for k in range(0, len(due), REFRESH_BATCH):
            batch = due[k:k + REFRESH_BATCH]
            expires = max(min(i for _, i in batch), ws.index_sweep_interval)
            refresh_batch.apply_async(args=[[name for name, _ in batch]], expires=expires)
        if due:
            r.hset(ENQUEUED_KEY, mapping={name: f"{now:.3f}" for name, _ in due})
        gone = (set(refreshed) | set(enqueued)) - set(topo.journals)
        for name in sorted(gone):
            publish_index(name, None)
        log.info("index sweep", journals=len(topo.journals), enqueued=len(due), removed=len(gone))
        return len(due)
