"""What `/api/state` returns: etcd's topology joined with the coordinators' own view.

etcd says what *should* be (specs, members, assignments, advertised routes); the
coordinators say what *is* (their journal list, broker counts, each journal's write
head); with a Redis URL, the index workers' storage accounting of each journal
(`quire:journal-stats`: fragments, stored bytes, oldest fragment) and each journal's
persisted watermark (`quire:watermarks`, docs/jobs.md) are joined in too, and the jobs
(specs, last runs, what the next window waits on: dashboards/jobs.py) are listed.
Any side may be down: what could not be read is reported in `errors` and the
rest of the snapshot is still served.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aetcd
import redis.asyncio as aioredis

from fragment_store.index_keys import STATS_KEY, WATERMARKS_KEY, decode_stats
from fragment_store.persist_status import BACKLOG_KEY, FAILURES_KEY, parse_backlog, parse_failures
from fragment_store.stats import StoreStats
from protocol import ProcessId
from quire.client import Client
from topology.etcd import client_for

from .jobs import job_rows
from .shards import shard_rows
from .topology import Topology, consistency, decode, labels_of, route_of

__all__ = ["StateCollector"]

WRITE_HEAD_LIMIT = 500
"""Journals whose write head is probed per snapshot (the rest show null)."""


class StateCollector:
    """Builds snapshots; at most one is built at a time and one is reused for `max_age`."""

    def __init__(self, etcd_url: str, root: str, *, brokers: list[str] | None = None,
                 timeout: float = 2.0, max_age: float = 1.0, redis_url: str | None = None) -> None:
        self.etcd_url = etcd_url
        self.redis_url = redis_url
        self._redis: aioredis.Redis | None = None
        self.root = root.rstrip("/") or "/quire"
        self.brokers = list(brokers or [])
        self.timeout = timeout
        self.max_age = max_age
        self._etcd: aetcd.Client | None = None
        self._client: Client | None = None
        self._client_endpoints: tuple[str, ...] = ()
        self._lock = asyncio.Lock()
        self._last: tuple[float, dict[str, Any]] | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._jobs_prefix = f"{self.root}/jobs/".encode()
        self._job_kvs: list[tuple[bytes, bytes]] = []

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._etcd is not None:
            await self._etcd.close()
            self._etcd = None
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None

    async def snapshot(self) -> dict[str, Any]:
        async with self._lock:
            now = time.monotonic()
            if self._last is not None and now - self._last[0] < self.max_age:
                return self._last[1]
            state = await self._build()
            self._last = (time.monotonic(), state)
            return state

    # -- reading ---------------------------------------------------------------------

    async def _topology(self) -> Topology:
        if self._etcd is None:
            client = client_for(self.etcd_url, timeout=self.timeout)
            await asyncio.wait_for(client.connect(), self.timeout)
            self._etcd = client
        try:
            resp = await asyncio.wait_for(self._etcd.get_prefix((self.root + "/").encode()),
                                          self.timeout)
        except BaseException:
            etcd, self._etcd = self._etcd, None
            await _quietly(etcd.close())
            raise
        self._shards = shard_rows(self.root, ((kv.key, kv.value) for kv in resp.kvs))
        self._job_kvs = [(kv.key, kv.value) for kv in resp.kvs
                         if kv.key.startswith(self._jobs_prefix)]
        return decode(self.root, ((kv.key, kv.value) for kv in resp.kvs), resp.header.revision)

    def _coordinators(self, topo: Topology | None) -> Client | None:
        endpoints = tuple(self.brokers) or tuple(sorted(
            m.endpoint for m in (topo.members.values() if topo else ()) if m.endpoint))
        if not endpoints:
            return None
        if self._client is None or endpoints != self._client_endpoints:
            if self._client is not None:  # the member set changed: a client for the new one
                task = asyncio.get_running_loop().create_task(self._client.close())
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
            self._client = Client(list(endpoints), connect_timeout=self.timeout,
                                  rpc_timeout=self.timeout, retry_timeout=self.timeout)
            self._client_endpoints = endpoints
        return self._client

    async def _build(self) -> dict[str, Any]:
        errors: list[str] = []
        topo: Topology | None = None
        try:
            topo = await self._topology()
        except Exception as exc:  # noqa: BLE001 - shown on the page, the rest still renders
            errors.append(f"etcd {self.etcd_url}: {_why(exc)}")
        client = self._coordinators(topo)
        listed: dict[str, Any] = {}
        brokers: dict[str, Any] = {}
        heads: dict[str, int | None] = {}
        if client is None:
            errors.append("no coordinator endpoint known (no members in etcd and no --broker)")
        else:
            results = await asyncio.gather(
                asyncio.wait_for(client.list_journals(), self.timeout * 2),
                asyncio.wait_for(client.list_brokers(), self.timeout * 2),
                return_exceptions=True)
            if isinstance(results[0], BaseException):
                errors.append(f"coordinators: list journals: {_why(results[0])}")
            else:
                listed = {e.spec.name: e for e in results[0]}
            if isinstance(results[1], BaseException):
                errors.append(f"coordinators: list brokers: {_why(results[1])}")
            else:
                brokers = {str(b.id): b for b in results[1]}
            names = sorted(set(listed) | set(topo.journals if topo else ()))
            heads = await self._write_heads(client, names[:WRITE_HEAD_LIMIT], errors)
        before = len(errors)
        storage = await self._storage(errors)
        # A Redis that could not be read for the stats is reported once, not asked again.
        watermarks = await self._watermarks(errors) if len(errors) == before else None
        backlog, failures = (await self._persist_status(errors) if len(errors) == before
                             else (None, None))
        state = _join(self, topo, listed, brokers, heads, storage, errors)
        now = time.time()
        for j in state["journals"]:
            j["watermark"] = watermarks.get(j["name"]) if watermarks is not None else None
            b = backlog.get(j["name"]) if backlog is not None else None
            j["backlog"] = (None if backlog is None else
                            {"bytes": b.bytes if b else 0, "age": b.age(now) if b else 0.0,
                             "fragments": b.fragments if b else 0})
            f = failures.get(j["name"]) if failures else None
            j["persist_failure"] = ({"reason": f.reason, "message": f.message, "store": f.store,
                                     "count": f.count, "last": f.last} if f else None)
        state["jobs"] = job_rows(self.root, self._job_kvs, watermarks) if topo else []
        return state

    def _redis_client(self) -> aioredis.Redis:
        if self._redis is None:
            self._redis = aioredis.from_url(self.redis_url, socket_timeout=self.timeout,
                                            socket_connect_timeout=self.timeout)
        return self._redis

    async def _watermarks(self, errors: list[str]) -> dict[str, float] | None:
        """journal -> persisted watermark (unix s) from the workers' Redis; None without
        Redis or when it could not be read (reported in `errors`)."""
        if not self.redis_url:
            return None
        try:
            raw = await asyncio.wait_for(self._redis_client().hgetall(WATERMARKS_KEY),
                                         self.timeout)
        except Exception as exc:  # noqa: BLE001 - shown on the page, the rest still renders
            errors.append(f"redis: watermarks: {_why(exc)}")
            return None
        out: dict[str, float] = {}
        for key, value in raw.items():
            try:
                out[key.decode()] = float(value)
            except ValueError:
                errors.append(f"redis: watermark of {key.decode(errors='replace')}: "
                              f"{value[:40]!r} is not a number")
        return out

    async def _persist_status(self, errors: list[str]) -> tuple[dict | None, dict | None]:
        """(journal -> PersistBacklog, journal -> PersistFailure) from the workers' Redis
        (fragment_store/persist_status.py); (None, None) without Redis or on error."""
        if not self.redis_url:
            return None, None
        try:
            r = self._redis_client()
            raw_backlog, raw_failures = await asyncio.wait_for(
                asyncio.gather(r.hgetall(BACKLOG_KEY), r.hgetall(FAILURES_KEY)), self.timeout)
        except Exception as exc:  # noqa: BLE001 - shown on the page, the rest still renders
            errors.append(f"redis: persistence backlog: {_why(exc)}")
            return None, None
        return parse_backlog(raw_backlog), parse_failures(raw_failures)

    async def _storage(self, errors: list[str]) -> dict[str, StoreStats]:
        """Per-journal storage stats the index workers keep in Redis ({} without Redis)."""
        if not self.redis_url:
            return {}
        try:
            raw = await asyncio.wait_for(self._redis_client().hgetall(STATS_KEY), self.timeout)
        except Exception as exc:  # noqa: BLE001 - shown on the page, the rest still renders
            errors.append(f"redis: storage stats: {_why(exc)}")
            return {}
        out: dict[str, StoreStats] = {}
        for key, value in raw.items():
            try:
                out[key.decode()] = decode_stats(value)
            except ValueError as exc:
                errors.append(f"redis: storage stats of {key.decode(errors='replace')}: {exc}")
        return out

    async def _write_heads(self, client: Client, names: list[str],
                           errors: list[str]) -> dict[str, int | None]:
        gate = asyncio.Semaphore(16)
        failed: list[str] = []

        async def one(name: str) -> int | None:
            async with gate:
                try:
                    return await asyncio.wait_for(client.write_head(name), self.timeout)
                except Exception:  # noqa: BLE001 - e.g. no primary yet: shown as unknown
                    failed.append(name)
                    return None

        values = await asyncio.gather(*(one(n) for n in names))
        if failed:
            errors.append(f"write head unknown for {len(failed)} journal(s), e.g. {sorted(failed)[0]}")
        return dict(zip(names, values, strict=True))


def _join(c: StateCollector, topo: Topology | None, listed: dict[str, Any],
          brokers: dict[str, Any], heads: dict[str, int | None],
          storage: dict[str, StoreStats], errors: list[str]) -> dict[str, Any]:
    topo = topo or Topology()
    endpoints = {m.id: m.endpoint for m in topo.members.values()}
    journals = []
    for name in sorted(set(topo.journals) | set(listed)):
        spec = topo.journals.get(name) or listed[name].spec
        assigned = topo.assignments.get(name, [])
        route = route_of(assigned) if assigned else (listed[name].route if name in listed else None)
        members = [str(m) for m in route.members] if route else []
        primary = route.primary_id if route else None
        journals.append({
            "name": name,
            "labels": labels_of(spec),
            "replication": spec.replication,
            "flags": spec.flags.value,
            "suspend": spec.suspend.level.value,
            "route": members,
            "endpoints": [endpoints.get(m, "") for m in route.members] if route else [],
            "primary": str(primary) if primary else None,
            "primary_endpoint": endpoints.get(primary, "") if primary else None,
            "write_head": heads.get(name),
            "storage": storage[name]._asdict() if name in storage else None,
            "consistency": consistency(assigned, spec.replication) if topo.revision else "unknown",
            "in_etcd": name in topo.journals,
            "listed_by_coordinators": name in listed,
        })
    counts: dict[ProcessId, list[int]] = {}
    for assigned in topo.assignments.values():
        for a in assigned:
            n = counts.setdefault(a.member, [0, 0])
            n[0] += 1
            n[1] += a.slot == 0
    members_out = []
    ids = set(topo.members) | {ProcessId.parse(k) for k in brokers}
    for pid in sorted(ids):
        m = topo.members.get(pid)
        b = brokers.get(str(pid))
        journal_count, primaries = counts.get(pid, [0, 0])
        members_out.append({
            "id": str(pid), "zone": pid.zone, "suffix": pid.suffix,
            "endpoint": (m.endpoint if m else "") or (b.endpoint if b else ""),
            "journal_limit": m.journal_limit if m else (b.journal_limit if b else 0),
            "exiting": bool(m and m.exiting),
            "health": (m.health if m else "") or (getattr(b, "health", "") if b else ""),
            "journals": journal_count, "primaries": primaries,
            "reported": {"assigned": b.assigned, "primaries": b.primaries} if b else None,
            "leader": pid == topo.leader,
            "in_etcd": m is not None,
        })
    return {
        "generated_at": time.time(),
        "etcd": {"url": c.etcd_url, "root": c.root, "revision": topo.revision,
                 "leader": str(topo.leader) if topo.leader else None,
                 "malformed_keys": topo.malformed},
        "journals": journals,
        "brokers": members_out,
        "shards": getattr(c, "_shards", []) if topo.revision else [],
        "errors": errors,
    }


def _why(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def _quietly(aw: Any) -> None:
    try:
        await aw
    except Exception:  # noqa: BLE001 - closing a broken client
        pass
