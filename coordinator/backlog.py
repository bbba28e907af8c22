"""Persistence backlog: per journal, the bytes acknowledged but not yet in the store.

Theory of operation
-------------------
A byte acknowledged to a writer reaches the store in two steps: its fragment closes (the
spool rolls: fragment length, flush interval, a suspend, an exit) and a persist worker
uploads it (coordinator/persister.py). Until both happened the byte lives only on the
replicas' disks. The journal's **primary** reports, per journal it leads:

* `bytes`: the open fragment's content plus every closed fragment still pending
  persistence (the persister drops a fragment once the index shows it persisted);
* `oldest`: the wall time of the first append of the oldest of those fragments, so
  `now - oldest` is the age of the oldest unpersisted acknowledged byte.

Only the primary reports (replicas hold the same bytes), so sums over coordinators are
cluster totals. The figures are computed on the event loop every `interval` seconds
(`BacklogReporter`), published to the Redis hash `quire:persist-backlog`
(fragment_store/persist_status.py: `quire journals list --stats`, the dashboard and
`quire doctor` read it) and exported as `quire_persist_backlog_bytes{journal}`,
`quire_persist_backlog_age_seconds{journal}` and `quire_persist_backlog_fragments{journal}`
(the age computed at scrape time from the last snapshot). A journal whose backlog drops to
zero has its Redis field deleted. Redis errors are logged once per outage, never raised.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from redis import asyncio as aioredis

from fragment_store.persist_status import BACKLOG_KEY, PersistBacklog
from protocol.logs import get_logger

__all__ = ["BacklogReporter", "journal_backlog", "route_gaps"]

log = get_logger(__name__)

INTERVAL = 5.0
"""Seconds between two reports (readers drop entries older than persist_status.STALE_AFTER)."""


def journal_backlog(host: Any, persister: Any, now: float | None = None) -> dict[str, PersistBacklog]:
    """The backlog of every journal `host` leads (see the module's docstring)."""
    now = time.time() if now is None else now
    me = str(getattr(host, "me", ""))
    pending = persister.unpersisted()
    out: dict[str, PersistBacklog] = {}
    for journal, replica in list(host.replicas.items()):
        if getattr(replica, "retired", False) or not persister.is_primary(journal):
            continue
        n, nbytes, oldest = pending.get(journal, (0, 0, float("inf")))
        spool = replica.spool
        if spool.content_length and spool.first_append_time:
            nbytes += spool.content_length
            oldest = min(oldest, spool.first_append_time)
        if nbytes:
            out[journal] = PersistBacklog(bytes=nbytes, fragments=n,
                                          oldest=oldest if oldest != float("inf") else now,
                                          coordinator=me, updated=now)
    return out


def route_gaps(host: Any) -> dict[str, int]:
    """journal -> replicas missing from its route, for the journals `host` leads whose
    route has fewer members than the spec's desired replication (exported as
    `quire_route_missing_replicas{journal}`: appends wait or fail while it lasts)."""
    resolver = getattr(getattr(host, "topology", None), "resolver", None)
    if resolver is None:
        return {}
    out: dict[str, int] = {}
    for journal, replica in list(host.replicas.items()):
        if getattr(replica, "retired", False):
            continue
        res = resolver.resolve_now(journal)
        if not res.is_primary or res.spec is None:
            continue
        missing = res.spec.desired_replication() - len(res.route.members)
        if missing > 0:
            out[journal] = missing
    return out


class BacklogReporter:
    """Computes the backlog every `interval` s; publishes it to Redis; feeds the metrics."""

    def __init__(self, redis_url: str, source: Callable[[], dict[str, PersistBacklog]], *,
                 routes: Callable[[], dict[str, int]] | None = None,
                 interval: float = INTERVAL, io_timeout: float = 3.0) -> None:
        self.redis_url = redis_url
        self.source = source
        self.routes = routes
        self.gaps: dict[str, int] = {}
        self.interval = interval
        self.io_timeout = io_timeout
        self.snapshot: dict[str, PersistBacklog] = {}
        self._published: set[str] = set()
        self._redis: aioredis.Redis | None = None
        self._failing = False
        _LIVE.add(self)

    async def run(self) -> None:
        try:
            while True:
                try:
                    self.snapshot = self.source()
                    self.gaps = self.routes() if self.routes is not None else {}
                except Exception:  # noqa: BLE001 - a figure must never stop the coordinator
                    log.exception("computing the persistence backlog failed")
                await self.publish()
                await asyncio.sleep(self.interval)
        finally:
            if self._redis is not None:
                try:
                    await asyncio.wait_for(self._redis.aclose(), 2.0)
                except BaseException:  # noqa: BLE001
                    pass

    async def publish(self) -> None:
        snap = self.snapshot
        gone = [j for j in self._published if j not in snap]
        if self._redis is None:
            self._redis = aioredis.Redis.from_url(self.redis_url, socket_timeout=self.io_timeout,
                                                  socket_connect_timeout=self.io_timeout)
        try:
            pipe = self._redis.pipeline(transaction=False)
            if snap:
                pipe.hset(BACKLOG_KEY, mapping={j: msgspec.json.encode(b) for j, b in snap.items()})
            if gone:
                pipe.hdel(BACKLOG_KEY, *gone)
            if snap or gone:
                await asyncio.wait_for(pipe.execute(), self.io_timeout * 2)
        except Exception as exc:  # noqa: BLE001 - Redis away: the next round tries again
            if not self._failing:
                log.warning("cannot publish the persistence backlog to Redis",
                            error=f"{type(exc).__name__}: {exc}")
            self._failing = True
            return
        self._failing = False
        self._published = set(snap)


_LIVE: weakref.WeakSet[BacklogReporter] = weakref.WeakSet()


class _BacklogCollector(Collector):
    def collect(self) -> Iterator[Any]:
        nbytes = GaugeMetricFamily(
            "quire_persist_backlog_bytes",
            "Bytes acknowledged but not yet in the store (open fragment + closed fragments "
            "pending), per journal; reported by the journal's primary only.", labels=["journal"])
        age = GaugeMetricFamily(
            "quire_persist_backlog_age_seconds",
            "Age of the oldest acknowledged byte not yet in the store, per journal "
            "(0 without a backlog); reported by the journal's primary only.", labels=["journal"])
        frags = GaugeMetricFamily(
            "quire_persist_backlog_fragments",
            "Closed fragments pending persistence, per journal (primary only).",
            labels=["journal"])
        missing = GaugeMetricFamily(
            "quire_route_missing_replicas",
            "Replicas missing from a journal's route (fewer members than its replication), "
            "reported by the journal's primary; absent while the route is full.",
            labels=["journal"])
        now = time.time()
        merged: dict[str, PersistBacklog] = {}
        gaps: dict[str, int] = {}
        for r in list(_LIVE):
            merged.update(r.snapshot)
            gaps.update(r.gaps)
        for journal, b in sorted(merged.items()):
            nbytes.add_metric([journal], b.bytes)
            age.add_metric([journal], b.age(now))
            frags.add_metric([journal], b.fragments)
        for journal, n in sorted(gaps.items()):
            missing.add_metric([journal], n)
        yield from (nbytes, age, frags, missing)


REGISTRY.register(_BacklogCollector())
