"""A small etcd mirror of a few key prefixes, kept current by watches (re-listed on loss).

The journal KeySpace decodes only the broker keyspace; consumers need shard specs,
consumer members, primary locks and notices, which this holds as raw key-values.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import TracebackType

import aetcd
from aetcd import rpc

from protocol.logs import get_logger
from topology.watch import watch_events

__all__ = ["KV", "Mirror"]

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class KV:
    value: bytes
    mod_revision: int
    create_revision: int
    lease: int


class Mirror:
    def __init__(self, client: aetcd.Client, prefixes: list[str]) -> None:
        self.client = client
        self.prefixes = prefixes
        self.kvs: dict[str, KV] = {}
        self.on_change: list[Callable[[], None]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.revision = 0
        self._seen: dict[str, int] = {}
        """Per prefix: the revision its watch has applied everything up to."""

    def items(self, prefix: str) -> Iterator[tuple[str, KV]]:
        for key, kv in list(self.kvs.items()):
            if key.startswith(prefix):
                yield key, kv

    def seen(self, key: str) -> int:
        """The revision through which this mirror's view of `key` is complete (0: none)."""
        return max((r for p, r in self._seen.items() if key.startswith(p)), default=0)

    async def __aenter__(self) -> Mirror:
        revs = [await self._load(p) for p in self.prefixes]
        self._tasks = [asyncio.create_task(self._run(p, r), name=f"mirror-{p}")
                       for p, r in zip(self.prefixes, revs)]
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(BaseException):
                await t

    async def _load(self, prefix: str) -> int:
        resp = await self.client.get_prefix(prefix.encode())
        for key in [k for k in self.kvs if k.startswith(prefix)]:
            del self.kvs[key]
        for kv in resp.kvs:
            self.kvs[kv.key.decode()] = KV(kv.value, kv.mod_revision, kv.create_revision, kv.lease)
        self.revision = max(self.revision, resp.header.revision)
        self._seen[prefix] = max(self._seen.get(prefix, 0), int(resp.header.revision))
        self._notify()
        return int(resp.header.revision)

    def _notify(self) -> None:
        for cb in list(self.on_change):
            cb()

    async def _run(self, prefix: str, revision: int) -> None:
        backoff = 0.1
        while True:
            try:
                # topology.watch's raw stream: aetcd's own watcher is not set up on quire's
                # EtcdClient (every process's client, TLS or not), so `watch_prefix` failed
                # at once and the mirror only ever caught up by re-listing.
                async with contextlib.aclosing(watch_events(self.client, prefix.encode(), revision + 1,
                                                            prefix=True)) as batches:
                    async for resp in batches:
                        through = revision  # complete through it: skip re-delivered events
                        for ev in resp.events:
                            if ev.kv.mod_revision <= through:
                                continue
                            key = ev.kv.key.decode()
                            if ev.type == rpc.Event.PUT:
                                self.kvs[key] = KV(ev.kv.value, ev.kv.mod_revision,
                                                   ev.kv.create_revision, ev.kv.lease)
                            else:
                                self.kvs.pop(key, None)
                            revision = max(revision, ev.kv.mod_revision)
                        self._seen[prefix] = max(self._seen.get(prefix, 0), revision)
                        self._notify()
                        backoff = 0.1
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any loss: re-list and watch again
                log.warning("shard mirror watch lost; re-listing", prefix=prefix, error=repr(exc))
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)
            with contextlib.suppress(Exception):
                revision = await self._load(prefix)
