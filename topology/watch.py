"""One etcd watch stream as an async iterator of event batches (raw gRPC, like `txn`).

aetcd's own watcher hides the compact revision and the response header, which are
exactly what a resuming watcher needs, so the KeySpace and a member's own-key watch
both read the stream here. The iterator yields only responses that carry events
(each one atomic: one etcd transaction is never split across responses) and ends by
raising `WatchEnded`:

- `compacted` > 0: the start revision was compacted away. Events between it and the
  compaction are gone; the watcher must re-read (re-list) what it mirrors and watch
  again from the read's revision + 1.
- otherwise the watch was cancelled or the stream closed (etcd restarted, its leader
  changed, the connection dropped): resume from the last revision seen + 1, and if
  that fails with `compacted`, re-list.

gRPC transport errors (etcd down) propagate as they are; callers treat every
exception the same way: back off, re-read, watch again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aetcd
from aetcd import rpc

from .etcd import prefix_end
from .etcd_client import EtcdClient

__all__ = ["WatchEnded", "watch_events"]


class WatchEnded(Exception):
    """The watch stream ended; `compacted` is etcd's compact revision when that is why."""

    def __init__(self, reason: str, compacted: int = 0) -> None:
        super().__init__(reason)
        self.compacted = compacted


async def watch_events(client: aetcd.Client, key: bytes, start_revision: int, *,
                       prefix: bool = False) -> AsyncIterator[Any]:
    """Yield every WatchResponse with events for `key` (or every key under it when
    `prefix`) from `start_revision` on. Use with `contextlib.aclosing`."""
    await client.connect()
    create = rpc.WatchCreateRequest(key=key, start_revision=start_revision)
    if prefix:
        create.range_end = prefix_end(key)
    requests: asyncio.Queue[Any] = asyncio.Queue()
    requests.put_nowait(rpc.WatchRequest(create_request=create))

    async def outgoing() -> Any:
        while True:
            yield await requests.get()

    # `hasleader`: a member that loses its leader (cut off from the quorum) cancels
    # the watch instead of keeping it silently open (clientv3's WithRequireLeader).
    channel = client.channel
    call = rpc.WatchStub(channel).Watch(outgoing(), metadata=(*(client.metadata or ()),
                                                              ("hasleader", "true")))
    try:
        async for resp in call:
            if resp.compact_revision:
                raise WatchEnded(f"compacted at {resp.compact_revision}", resp.compact_revision)
            if resp.canceled:
                if isinstance(client, EtcdClient) and "leader" in resp.cancel_reason:
                    client.fail_over(f"watch: {resp.cancel_reason}", channel=channel)
                raise WatchEnded(f"watch cancelled: {resp.cancel_reason}")
            if resp.created or not resp.events:
                continue
            yield resp
        raise WatchEnded("watch stream closed by etcd")
    except rpc.AioRpcError as exc:
        if isinstance(client, EtcdClient):
            client.note(exc, channel)
        raise
    finally:
        call.cancel()
