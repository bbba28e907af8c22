"""The coordinator's Persister: hands closed fragments to Celery persist workers.

Theory of operation
-------------------
`on_closed(fragment, path)` is called on the hot path when a spool rolls. It only
records the fragment in `pending` and wakes the background loop (`run()`), so an
append never waits on Redis. The loop enqueues `workers.persist.persist_fragment`
by name (`send_task`, never importing `workers/`) on a dedicated thread with a
timeout; when Redis is down the send fails fast, the fragment stays pending (its
bytes stay on local disk) and the loop retries with bounded exponential backoff.

A fragment leaves `pending` only when the fragment index shows it persisted:
`mark_persisted(journal, remote)` (called with each index update from IndexWatch)
drops every pending fragment covered by a remote one. A fragment still pending
`resend_after` seconds after a successful send is enqueued again, which covers a
task lost with a Redis restart (Redis runs without persistence) or a worker pool
that gave up. Persist tasks are idempotent, so duplicates cost an Exists check.

Replicas that are not the journal's primary delay their first send by
`replica_delay` (as Gazette's replicas do): the primary usually persists first and
the index update removes the fragment before a replica ever sends it.

Lag per journal (bytes and seconds closed-but-not-persisted) is exposed by `lag()`
and as `quire_persist_lag_bytes` / `quire_persist_lag_seconds`. The backlog of the
journals we lead (the open fragment too, aged from each fragment's first append:
`opened_at`) is computed and published by coordinator/backlog.py from `unpersisted()`,
on a task `run()` starts when given a `backlog` source.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import os
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import msgspec
from celery import Celery
from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from protocol.logs import get_logger
from protocol import Fragment

__all__ = ["CeleryPersister", "JournalLag", "PERSIST_TASK", "make_celery_client"]

log = get_logger(__name__)

PERSIST_TASK = "workers.persist.persist_fragment"
PERSIST_QUEUE = "persist"


def make_celery_client(redis_url: str, *, io_timeout: float = 3.0) -> Celery:
    """A bare Celery app that only publishes: no result backend (nothing to wait
    on), no publish retries (the persister retries on its own schedule), and short
    socket timeouts so a dead Redis fails a send in seconds."""
    from protocol.redis_security import celery_redis_conf

    app = Celery("quire-coordinator", broker=redis_url, set_as_current=False)
    app.conf.update(
        **celery_redis_conf(redis_url),
        task_serializer="json",
        accept_content=["json"],
        task_publish_retry=False,
        task_send_sent_event=True,  # Flower shows the task as queued
        broker_connection_retry=False,
        broker_connection_max_retries=0,
        broker_connection_timeout=io_timeout,
        broker_pool_limit=1,
        broker_transport_options={
            "socket_timeout": io_timeout,
            "socket_connect_timeout": io_timeout,
            "max_retries": 0,
        },
    )
    return app


@dataclass
class _Pending:
    fragment: Fragment
    path: str
    closed_at: float  # wall clock, for lag in seconds
    due: float  # monotonic time of the next send
    sends: int = 0
    opened_at: float = 0.0  # wall clock of its first acknowledged byte (backlog age)


@dataclass(frozen=True)
class JournalLag:
    fragments: int
    bytes: int
    seconds: float


@dataclass
class _Stats:
    enqueued: int = 0
    enqueue_failures: int = 0
    persisted: int = 0
    last_error: str = ""
    broker_down_since: float | None = field(default=None)


class CeleryPersister:
    """Implements the coordinator's `Persister` protocol (`async on_closed`).

    endpoints(fragment) -> replica `host:port`s that hold it (ours first).
    store_for(journal)  -> the journal's stores[0] URL, or None (not persisted).
    is_primary(journal) -> whether we are its primary (replicas send later).
    """

    def __init__(
        self,
        redis_url: str,
        *,
        endpoints: Callable[[Fragment], Sequence[str]],
        store_for: Callable[[str], str | None],
        is_primary: Callable[[str], bool] = lambda _journal: True,
        opened_at: Callable[[Fragment], float | None] = lambda _fragment: None,
        backlog: Callable[[], Any] | None = None,
        routes: Callable[[], Any] | None = None,
        resend_after: float = 120.0,
        replica_delay: float = 120.0,
        enqueue_timeout: float = 5.0,
        backoff_initial: float = 0.5,
        backoff_max: float = 15.0,
        celery_app: Celery | None = None,
    ) -> None:
        self.redis_url = redis_url
        self._endpoints = endpoints
        self._store_for = store_for
        self._is_primary = is_primary
        self._opened_at = opened_at
        self._backlog = backlog
        """Returns the journals' backlog (coordinator/backlog.py); published while running."""
        self._routes = routes
        """Returns the route gaps of the journals we lead (coordinator/backlog.route_gaps)."""
        self.resend_after = resend_after
        self.replica_delay = replica_delay
        self.enqueue_timeout = enqueue_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self._backoff = backoff_initial
        self._app = celery_app
        self._owns_app = celery_app is None
        self._pending: dict[tuple[str, int, int, str], _Pending] = {}
        self._wake = asyncio.Event()
        self._progress = asyncio.Event()  # a fragment left `pending`, or a send failed
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="quire-persister")
        self._inflight: asyncio.Future[Any] | None = None
        self.stats = _Stats()
        _LIVE.add(self)

    # -- the Persister protocol (hot path: never blocks) -----------------------------

    async def on_closed(self, fragment: Fragment, path: str | os.PathLike[str] | None = None,
                        primary: bool | None = None) -> None:
        self.closed(fragment, path, primary)

    def closed(self, fragment: Fragment, path: str | os.PathLike[str] | None = None,
               primary: bool | None = None) -> None:
        """Synchronous form of on_closed (the spool observer is synchronous).

        `primary` says whether this replica was the journal's primary when the
        fragment closed; None asks `is_primary(journal)`.
        """
        if fragment.begin == fragment.end:
            return
        key = (fragment.journal, fragment.begin, fragment.end, fragment.sum)
        if key in self._pending:
            return
        if primary is None:
            primary = self._is_primary(fragment.journal)
        delay = 0.0 if primary else self.replica_delay
        now = time.time()
        self._pending[key] = _Pending(fragment, os.fspath(path) if path is not None else "",
                                      now, time.monotonic() + delay,
                                      opened_at=self._opened_at(fragment) or now)
        log.debug("fragment queued for persistence", journal=fragment.journal,
                  begin=fragment.begin, end=fragment.end, delay=delay)
        self._wake.set()

    # -- feedback from the index ------------------------------------------------------

    def mark_persisted(self, journal: str, remote: Iterable[Fragment]) -> list[Fragment]:
        """Drop pending fragments of `journal` covered by a persisted one; return them."""
        spans = sorted((f.begin, f.end) for f in remote if f.end > f.begin)
        if not spans:
            return []
        begins = [b for b, _ in spans]
        reach: list[int] = []  # reach[i] = the greatest end among spans[:i + 1]
        for _, e in spans:
            reach.append(max(e, reach[-1]) if reach else e)
        done: list[Fragment] = []
        for key, p in list(self._pending.items()):
            if key[0] != journal:
                continue
            f = p.fragment
            i = bisect.bisect_right(begins, f.begin) - 1
            if i >= 0 and reach[i] >= f.end:
                del self._pending[key]
                done.append(f)
        if done:
            self._progress.set()
            self.stats.persisted += len(done)
            log.info("fragments persisted", journal=journal, count=len(done),
                     end=max(f.end for f in done))
        return done

    def forget(self, journal: str) -> int:
        """Stop tracking a journal (deleted, or its replica left this coordinator)."""
        keys = [k for k in self._pending if k[0] == journal]
        for k in keys:
            del self._pending[k]
        self._progress.set()
        return len(keys)

    # -- exit (coordinator/drain.py) ----------------------------------------------------

    def flush(self) -> None:
        """Exiting (Gazette's Finish): send every pending fragment now, replicas' too."""
        now = time.monotonic()
        for p in self._pending.values():
            p.due = min(p.due, now)
        self._backoff = self.backoff_initial
        self._wake.set()

    async def wait_persisted(self, fragments: Iterable[Fragment], timeout: float) -> list[Fragment]:
        """Wait (bounded) until none of `fragments` is pending; those still pending.
        Gives up early once a send fails: with the task broker down nothing will move."""
        keys = {(f.journal, f.begin, f.end, f.sum): f for f in fragments}
        deadline, failures = time.monotonic() + timeout, self.stats.enqueue_failures
        while True:
            left = [f for k, f in keys.items() if k in self._pending]
            remaining = deadline - time.monotonic()
            if not left or remaining <= 0 or self.stats.enqueue_failures > failures:
                return left
            self._progress.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._progress.wait()

    # -- observability ----------------------------------------------------------------

    def pending(self) -> list[Fragment]:
        return [p.fragment for p in self._pending.values()]

    def lag(self) -> dict[str, JournalLag]:
        now = time.time()
        acc: dict[str, list[float]] = {}
        for p in self._pending.values():
            n, b, oldest = acc.setdefault(p.fragment.journal, [0, 0, now])
            acc[p.fragment.journal] = [n + 1, b + p.fragment.content_length, min(oldest, p.closed_at)]
        return {j: JournalLag(int(n), int(b), max(0.0, now - oldest)) for j, (n, b, oldest) in acc.items()}

    def unpersisted(self) -> dict[str, tuple[int, int, float]]:
        """journal -> (closed fragments pending, their bytes, the earliest first-byte time)."""
        acc: dict[str, tuple[int, int, float]] = {}
        for p in list(self._pending.values()):
            j = p.fragment.journal
            n, b, oldest = acc.get(j, (0, 0, float("inf")))
            acc[j] = (n + 1, b + p.fragment.content_length, min(oldest, p.opened_at or p.closed_at))
        return acc

    def is_primary(self, journal: str) -> bool:
        return self._is_primary(journal)

    @property
    def broker_available(self) -> bool:
        return self.stats.broker_down_since is None

    # -- the background loop ----------------------------------------------------------

    async def run(self) -> None:
        """Enqueue due fragments until cancelled. Owned by the coordinator's TaskGroup.
        With a `backlog` source, also publishes the journals' backlog (coordinator/backlog.py)."""
        reporter = None
        if self._backlog is not None:
            from .backlog import BacklogReporter

            reporter = asyncio.create_task(
                BacklogReporter(self.redis_url, self._backlog, routes=self._routes).run(),
                name="persist-backlog")
        try:
            while True:
                wait = await self._send_due()
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._wake.wait()
        finally:
            if reporter is not None:
                reporter.cancel()
                with contextlib.suppress(BaseException):
                    await reporter
            self.close()

    async def _send_due(self) -> float:
        """Send what is due; return how long to sleep before the next check."""
        now = time.monotonic()
        due = sorted((p for p in self._pending.values() if p.due <= now), key=lambda p: p.due)
        for p in due:
            key = (p.fragment.journal, p.fragment.begin, p.fragment.end, p.fragment.sum)
            if self._pending.get(key) is not p:
                continue  # persisted or forgotten while we were sending
            if not await self._send(p):
                delay = self._backoff
                self._backoff = min(self.backoff_max, self._backoff * 2)
                for q in due:  # the broker is down: everything due waits the same
                    q.due = max(q.due, time.monotonic() + delay)
                return delay
            self._backoff = self.backoff_initial
            p.sends += 1
            p.due = time.monotonic() + self.resend_after
        later = [p.due for p in self._pending.values()]
        return max(0.05, min(later) - time.monotonic()) if later else 60.0

    async def _send(self, p: _Pending) -> bool:
        store = self._store_for(p.fragment.journal)
        if not store:
            # No store (or the journal is gone): nothing will ever persist it.
            self.forget_fragment(p.fragment)
            return True
        kwargs = {
            "fragment": msgspec.to_builtins(p.fragment),
            "endpoints": list(self._endpoints(p.fragment)),
            "store": store,
        }
        if self._inflight is not None and not self._inflight.done():
            return False  # a previous send is still stuck in the thread
        loop = asyncio.get_running_loop()
        self._inflight = loop.run_in_executor(self._executor, self._publish, kwargs)
        try:
            async with asyncio.timeout(self.enqueue_timeout):
                await asyncio.shield(self._inflight)
        except Exception as exc:  # noqa: BLE001 - any failure means "Redis is not taking it"
            self._on_send_failure(exc)
            return False
        self.stats.enqueued += 1
        if self.stats.broker_down_since is not None:
            log.info("task broker reachable again; persistence resumes",
                     down_for=round(time.time() - self.stats.broker_down_since, 1),
                     pending=len(self._pending))
            self.stats.broker_down_since = None
        return True

    def forget_fragment(self, fragment: Fragment) -> None:
        self._pending.pop((fragment.journal, fragment.begin, fragment.end, fragment.sum), None)
        self._progress.set()

    def _publish(self, kwargs: dict[str, Any]) -> None:
        if self._app is None:
            self._app = make_celery_client(self.redis_url)
        try:
            self._app.send_task(PERSIST_TASK, kwargs=kwargs, queue=PERSIST_QUEUE, retry=False)
        except BaseException:
            # A pooled connection to a Redis that went away stays broken; start
            # from a fresh client next time rather than trusting the pool.
            self._drop_app()
            raise

    def _on_send_failure(self, exc: BaseException) -> None:
        self.stats.enqueue_failures += 1
        self._progress.set()
        self.stats.last_error = f"{type(exc).__name__}: {exc}"
        if self.stats.broker_down_since is None:
            self.stats.broker_down_since = time.time()
            log.warning("cannot enqueue persist tasks; fragments stay on local disk",
                        error=self.stats.last_error, pending=len(self._pending))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._drop_app()

    def _drop_app(self) -> None:
        """Close the Celery client we made (never one we were given)."""
        if self._owns_app and self._app is not None:
            app, self._app = self._app, None
            try:
                app.close()
            except Exception:  # noqa: BLE001
                pass


# -- metrics ----------------------------------------------------------------------------

_LIVE: weakref.WeakSet[CeleryPersister] = weakref.WeakSet()


class _LagCollector(Collector):
    def collect(self) -> Iterator[Any]:
        lag_bytes = GaugeMetricFamily(
            "quire_persist_lag_bytes",
            "Bytes of closed fragments not yet persisted to the store, per journal.",
            labels=["journal"])
        lag_seconds = GaugeMetricFamily(
            "quire_persist_lag_seconds",
            "Age of the oldest closed fragment not yet persisted, per journal.",
            labels=["journal"])
        pending = GaugeMetricFamily(
            "quire_persist_pending_fragments",
            "Closed fragments not yet persisted, per journal.", labels=["journal"])
        enqueued = CounterMetricFamily(
            "quire_persist_enqueued", "Persist tasks sent to the task broker.")
        failures = CounterMetricFamily(
            "quire_persist_enqueue_failures",
            "Attempts to send a persist task that failed (task broker unreachable).")
        down = GaugeMetricFamily(
            "quire_persist_broker_up", "1 if the last persist-task send succeeded, else 0.")
        totals: dict[str, JournalLag] = {}
        sent = failed = 0
        up = 1
        for p in list(_LIVE):
            for journal, lag in p.lag().items():
                prev = totals.get(journal)
                totals[journal] = lag if prev is None else JournalLag(
                    prev.fragments + lag.fragments, prev.bytes + lag.bytes, max(prev.seconds, lag.seconds))
            sent += p.stats.enqueued
            failed += p.stats.enqueue_failures
            up = up and p.broker_available
        for journal, lag in sorted(totals.items()):
            lag_bytes.add_metric([journal], lag.bytes)
            lag_seconds.add_metric([journal], lag.seconds)
            pending.add_metric([journal], lag.fragments)
        enqueued.add_metric([], sent)
        failures.add_metric([], failed)
        down.add_metric([], 1 if up else 0)
        yield from (lag_bytes, lag_seconds, pending, enqueued, failures, down)


REGISTRY.register(_LagCollector())
