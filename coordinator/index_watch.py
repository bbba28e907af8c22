"""Feeds the fragment index computed by the index workers into the coordinator.

Theory of operation
-------------------
Index workers list the store, build the covering set of each journal, store it
as JSON under `quire:index:<journal>` and `PUBLISH quire:index-updates <journal>`
(docs/architecture.md, "Redis keys"). IndexWatch subscribes to that channel and,
for every journal this coordinator hosts, loads the key and hands the fragments to
`apply(journal, fragments)` — the coordinator wires that to the replica's
`set_remote_index` (which merges it, drops local fragments covered by persisted
ones and raises INDEX_HAS_GREATER_OFFSET from it) and to the persister's
`mark_persisted`.

Pub/sub is not durable: after every (re)subscription the watch reloads the keys of
all hosted journals, so an update published while we were disconnected is never
lost; a journal that becomes hosted later is loaded within a second. Updates are
taken in batches (everything buffered, up to `batch`), filtered by the hosted journals
(looked at once a second, not per message) and loaded in one Redis pipeline. A Redis
outage is survived with bounded exponential backoff; nothing here
is on the append path, so while Redis is away the coordinator simply keeps the
index it has (and its local fragments). `load(journal)` fetches one journal at
once, e.g. when a replica is created.

`quire_index_age_seconds{journal}` is the time since a worker last refreshed the
index this coordinator holds for the journal. A worker publishes a journal's index
only when it changed (workers/index.py), but stamps `quire:index-refreshed` at every
refresh; so every INDEX_AGE_LOOK seconds the watch reads the stamps of the hosted
journals it holds an index for — one pipeline of HMGETs, no index fetched, decoded or
applied — and the age stays truthful (within INDEX_AGE_LOOK) for idle journals (#49).
"""

from __future__ import annotations

import asyncio
import inspect
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any

import msgspec
import redis.asyncio as aioredis
from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from redis.exceptions import RedisError

from fragment_store.index_keys import INDEX_CHANNEL, INDEX_KEY_PREFIX, REFRESHED_KEY
from protocol import Fragment
from protocol.logs import get_logger

__all__ = ["IndexWatch", "INDEX_CHANNEL", "INDEX_KEY_PREFIX", "REFRESHED_KEY", "decode_index",
           "list_store_index", "listable"]

log = get_logger(__name__)


_DECODER = msgspec.json.Decoder(tuple[Fragment, ...])

Apply = Callable[[str, tuple[Fragment, ...]], "Awaitable[None] | None"]


def decode_index(raw: bytes | str) -> tuple[Fragment, ...]:
    return _DECODER.decode(raw)


def _honour_cancellation() -> None:
    """Re-raise a cancellation a library swallowed.

    redis-py's read timeout (an `asyncio.timeout` inside `get_message`) turns a
    cancellation that races with its own expiry into "no message": get_message returns
    None and this task, asked to stop, would poll on until SIGKILL. The request is
    still counted (`Task.cancelling()`), so honour it here.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


HOSTED_LOOK = 1.0
"""Seconds between two looks at the hosted journals (a copy of thousands of names)."""

INDEX_AGE_LOOK = 10.0
"""Seconds between two reads of the hosted journals' refresh stamps (an unchanged
journal's refresh publishes nothing): the most `quire_index_age_seconds` lags."""

STAMP_CHUNK = 1000
"""Journals per HMGET of those stamps (all in one pipeline, one round trip)."""

STORE_LIST_TIMEOUT = 5.0
"""Bound of a coordinator's own listing of a journal's store (no index in Redis)."""


def listable(store_url: str) -> bool:
    """Whether we list this store ourselves: a file store, or an S3 store whose endpoint
    is configured (QUIRE_S3_ENDPOINT, AWS_ENDPOINT_URL[_S3] or the URL's `endpoint=`) —
    never the AWS default guessed for a store this coordinator was not set up to reach."""
    import os

    if store_url.startswith("file:"):
        return True
    return store_url.startswith("s3:") and ("endpoint=" in store_url or any(
        os.environ.get(k) for k in ("QUIRE_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")))


async def list_store_index(replica, store_url: str) -> None:  # noqa: ANN001
    """The replica's first index from a listing of the store; on failure (the store
    unreachable, or no credentials here) the empty index, as before, and say so."""
    from fragment_store import CoverSet, list_fragments, open_store

    try:
        async with asyncio.timeout(STORE_LIST_TIMEOUT):
            listed = await asyncio.to_thread(
                lambda: list_fragments(open_store(store_url), replica.journal))
    except Exception as exc:  # noqa: BLE001 - any failure: fall back, loudly
        log.warning("no fragment index and the store cannot be listed; taking the index "
                    "as empty", journal=replica.journal, store=store_url, error=repr(exc))
        listed = []
    if replica.index_ready:
        return  # the index arrived meanwhile (it wins: the workers list every store)
    if listed:
        log.info("no fragment index yet: the store holds the journal", journal=replica.journal,
                 end=max(f.end for f in listed))
        replica.set_remote_index(list(CoverSet(listed)))
    else:
        replica.index_loaded()


class IndexWatch:
    """Subscribe to index updates and apply them for hosted journals.

    apply(journal, fragments) -- called with the journal's full covering set (may be
                                 a coroutine function); must not block for long.
    journals()                -- the journal names this coordinator hosts now.
    """

    def __init__(
        self,
        redis_url: str,
        *,
        apply: Apply,
        journals: Callable[[], Iterable[str]],
        loaded: Callable[[str], None] | None = None,
        io_timeout: float = 5.0,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        batch: int = 256,
        age_look: float = INDEX_AGE_LOOK,
    ) -> None:
        self.redis_url = redis_url
        self._apply = apply
        self._loaded = loaded
        """Told of every journal a load answered for, with an index or without one."""
        self._journals = journals
        self.io_timeout = io_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.batch = batch
        self.age_look = age_look
        self._redis: aioredis.Redis | None = None
        self._queued: set[str] = set()
        """Journals waiting for `flush_queued` (their replicas were just created)."""
        self._flushing = False
        self.flushes = 0
        """`load` calls made by `flush_queued` (for tests)."""
        self.connected = asyncio.Event()
        self.refreshed_at: dict[str, float] = {}
        """journal -> unix time of the refresh of the index we last applied."""
        self.applied: dict[str, int] = {}
        """journal -> number of index updates applied (for tests and debugging)."""
        self.reconnects = 0
        _LIVE.add(self)

    def _client(self) -> aioredis.Redis:
        if self._redis is None:
            self._redis = aioredis.Redis.from_url(
                self.redis_url,
                socket_timeout=self.io_timeout,
                socket_connect_timeout=self.io_timeout,
                health_check_interval=max(1, int(self.io_timeout)),
            )
        return self._redis

    async def run(self) -> None:
        """Watch until cancelled; never raises on Redis errors."""
        backoff = self.backoff_initial
        try:
            while True:
                try:
                    await self._session()
                except asyncio.CancelledError:
                    raise
                except (RedisError, OSError, asyncio.TimeoutError) as exc:
                    if self.connected.is_set():
                        log.warning("index watch lost Redis; retrying", error=str(exc))
                    else:
                        log.debug("index watch cannot reach Redis", error=str(exc), backoff=backoff)
                _honour_cancellation()
                if self.connected.is_set():
                    backoff = self.backoff_initial  # it worked for a while: start over
                self.connected.clear()
                await self._reset()
                self.reconnects += 1
                await asyncio.sleep(backoff)
                backoff = min(self.backoff_max, backoff * 2)
        finally:
            await self._reset()

    async def _session(self) -> None:
        client = self._client()
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            async with asyncio.timeout(self.io_timeout):
                await pubsub.subscribe(INDEX_CHANNEL)
            # Subscribed first, then reload: anything published from now on is seen.
            hosted = set(self._journals())
            looked = time.monotonic()
            await self.load_all(hosted)
            stamped = time.monotonic()
            self.connected.set()
            log.info("index watch subscribed", channel=INDEX_CHANNEL, journals=len(hosted))
            while True:
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                _honour_cancellation()
                # Every update already buffered, loaded in one pipeline: the cost is per
                # batch of updates, not a round trip (and a hosted-set copy) per journal.
                updates: set[str] = set()
                while msg is not None:
                    if msg.get("type") == "message":
                        data = msg["data"]
                        updates.add(data.decode() if isinstance(data, bytes) else str(data))
                    if len(updates) >= self.batch:
                        break  # (the rest stays buffered for the next turn)
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0)
                if time.monotonic() - looked >= HOSTED_LOOK:
                    # A replica created since the last look gets its index now, not at
                    # the journal's next refresh (and at once through `load_quietly`).
                    now_hosted = set(self._journals())
                    looked = time.monotonic()
                    if now_hosted - hosted:
                        await self.load_all(now_hosted - hosted)
                    hosted = now_hosted
                if updates & hosted:
                    await self.load(sorted(updates & hosted))
                if time.monotonic() - stamped >= self.age_look:
                    stamped = time.monotonic()
                    await self.read_stamps(hosted)
        finally:
            try:
                async with asyncio.timeout(1.0):
                    await pubsub.aclose()
            except Exception:  # noqa: BLE001 - the connection may already be gone
                pass

    async def load_all(self, journals: Iterable[str] | None = None) -> None:
        names = sorted(set(self._journals() if journals is None else journals))
        for i in range(0, len(names), self.batch):
            await self.load(names[i:i + self.batch])

    async def load(self, journals: Iterable[str]) -> int:
        """Fetch and apply the indexes of `journals`; return how many were applied."""
        names = list(journals)
        if not names:
            return 0
        client = self._client()

        async def fetch() -> list[Any]:
            async with client.pipeline(transaction=False) as pipe:
                for name in names:
                    pipe.get(INDEX_KEY_PREFIX + name)
                pipe.hmget(REFRESHED_KEY, names)
                return await pipe.execute()

        async with asyncio.timeout(self.io_timeout * 2):
            results = await fetch()
        _honour_cancellation()
        stamps = results[-1]
        count = 0
        for name, raw, stamp in zip(names, results[:-1], stamps):
            if raw is None:
                if self._loaded is not None:
                    self._loaded(name)  # nothing persisted yet: an empty index is known
                continue
            try:
                fragments = decode_index(raw)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.warning("ignoring a malformed fragment index", journal=name, error=str(exc))
                continue
            if stamp is not None:
                try:
                    self.refreshed_at[name] = float(stamp)
                except ValueError:
                    pass
            result = self._apply(name, fragments)
            if inspect.isawaitable(result):
                await result
            self.applied[name] = self.applied.get(name, 0) + 1
            if self._loaded is not None:
                self._loaded(name)
            count += 1
        return count

    async def read_stamps(self, journals: Iterable[str]) -> int:
        """Read the refresh stamps of those of `journals` we hold an index for; return
        how many advanced."""
        names = sorted(j for j in journals if j in self.refreshed_at)
        if not names:
            return 0
        client = self._client()

        async def fetch() -> list[Any]:
            async with client.pipeline(transaction=False) as pipe:
                for i in range(0, len(names), STAMP_CHUNK):
                    pipe.hmget(REFRESHED_KEY, names[i:i + STAMP_CHUNK])
                return await pipe.execute()

        async with asyncio.timeout(self.io_timeout * 2):
            results = await fetch()
        _honour_cancellation()
        advanced = 0
        for name, stamp in zip(names, (s for chunk in results for s in chunk)):
            try:
                t = float(stamp) if stamp is not None else 0.0  # None: removed (published)
            except ValueError:
                continue
            if t > self.refreshed_at.get(name, 0.0):
                self.refreshed_at[name] = t
                advanced += 1
        return advanced

    def queue(self, journal: str) -> bool:
        """Queue `journal` to be loaded now (a replica was just created). True when the
        caller must start `flush_queued` (none runs): one task loads every queued
        journal in batches. (A task and a Redis pipeline per created replica ran
        thousands at once when a coordinator took thousands of journals, and one broken
        connection's error killed the coordinator.)"""
        self._queued.add(journal)
        if self._flushing:
            return False
        self._flushing = True
        return True

    async def flush_queued(self) -> None:
        """Load the queued journals, `batch` at a time, until none is left. Errors are
        only logged: the watch's own session retries every hosted journal."""
        try:
            while self._queued:
                names = sorted(self._queued)[:self.batch]
                self._queued.difference_update(names)
                self.flushes += 1
                try:
                    await self.load(names)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - RedisError, OSError, timeouts, and
                    # uvloop's RuntimeError for a transport closed under a pipeline
                    log.debug("index load deferred", journals=len(names), error=repr(exc))
        finally:
            self._flushing = False

    async def _reset(self) -> None:
        client, self._redis = self._redis, None
        if client is not None:
            try:
                async with asyncio.timeout(1.0):
                    await client.aclose()
            except Exception:  # noqa: BLE001
                pass

    def index_age(self) -> dict[str, float]:
        now = time.time()
        hosted = set(self._journals())
        return {j: max(0.0, now - t) for j, t in self.refreshed_at.items() if j in hosted}


_LIVE: weakref.WeakSet[IndexWatch] = weakref.WeakSet()


class _AgeCollector(Collector):
    def collect(self) -> Iterator[Any]:
        age = GaugeMetricFamily(
            "quire_index_age_seconds",
            "Seconds since the fragment index held by this coordinator was refreshed "
            "from the store by a worker, per hosted journal.",
            labels=["journal"])
        up = GaugeMetricFamily(
            "quire_index_watch_connected", "1 while the index watch is subscribed to Redis.")
        ages: dict[str, float] = {}
        connected = 1
        for w in list(_LIVE):
            for j, a in w.index_age().items():
                ages[j] = min(a, ages.get(j, a))
            connected = connected and w.connected.is_set()
        for j, a in sorted(ages.items()):
            age.add_metric([j], a)
        up.add_metric([], 1 if connected else 0)
        yield age
        yield up


REGISTRY.register(_AgeCollector())
