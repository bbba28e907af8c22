"""A worker announces the stores it writes to: `<root>/workers/<node>` under its lease.

The worker's main process starts `Announcer` when Celery says the worker is ready (a
daemon thread with its own event loop: Celery's main thread is not asyncio) and stops it
at shutdown, revoking the lease so the key vanishes at once; a killed worker's key
expires with its lease (topology.worker_stores.WORKER_TTL). etcd being down only delays
the announcement: the thread retries with a bounded backoff and re-announces under a
fresh lease whenever the old one is lost. `quire journals apply` reads the keys
(tools/cli/store_check.py).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

import msgspec

from protocol.logs import get_logger
from topology.etcd import connect, put_op, txn
from topology.worker_stores import WORKER_TTL, WorkerStores, worker_key

__all__ = ["Announcer", "announcement"]

log = get_logger(__name__)


def announcement(node: str, store_url: str, extra_stores: tuple[str, ...], auth: bool) -> WorkerStores:
    """What a worker with these settings accepts (the rule of workers/persist.check_store)."""
    stores = tuple(dict.fromkeys(s for s in (store_url, *extra_stores) if s))
    return WorkerStores(worker=node, stores=stores, restricted=auth or bool(extra_stores),
                        auth=auth, pid=os.getpid(), started=time.time())


class Announcer:
    def __init__(self, etcd_url: str, root: str, value: WorkerStores, *,
                 ttl: int = WORKER_TTL, io_timeout: float = 10.0) -> None:
        self.etcd_url = etcd_url
        self.key = worker_key(root, value.worker)
        self.value = msgspec.json.encode(value)
        self.ttl = ttl
        self.io_timeout = io_timeout
        self.announced = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="quire-announce", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Revoke the lease (the key goes with it) and end the thread, within `timeout`."""
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)

    def _main(self) -> None:
        try:
            self._loop.run_until_complete(self._run())
        finally:
            self._loop.close()

    async def _run(self) -> None:
        self._stop = asyncio.Event()
        backoff = 0.5
        while not self._stop.is_set():
            try:
                await self._hold()
                backoff = 0.5
            except Exception as exc:  # noqa: BLE001 - etcd away: retry, never kill the worker
                self.announced.clear()
                log.warning("cannot announce this worker's stores in etcd; retrying",
                            key=self.key, error=f"{type(exc).__name__}: {exc}", backoff=backoff)
            if not self._stop.is_set():
                try:
                    async with asyncio.timeout(backoff):
                        await self._stop.wait()
                except TimeoutError:
                    pass
                backoff = min(backoff * 2, 10.0)

    async def _hold(self) -> None:
        """Announce under a fresh lease and keep it alive until stopped (or it is lost)."""
        assert self._stop is not None
        client = await connect(self.etcd_url, timeout=self.io_timeout)
        try:
            lease = await client.lease(self.ttl)
            await txn(client, [], [put_op(self.key, self.value, lease.id)])
            self.announced.set()
            log.info("worker stores announced", key=self.key)
            try:
                while not self._stop.is_set():
                    try:
                        async with asyncio.timeout(self.ttl / 3):
                            await self._stop.wait()
                    except TimeoutError:
                        pass
                    if self._stop.is_set():
                        break
                    async with asyncio.timeout(self.io_timeout):
                        reply: Any = await client.refresh_lease(lease.id)
                    if reply is not None and reply.TTL <= 0:
                        raise RuntimeError("the announcement's lease expired")
            finally:
                if self._stop.is_set():
                    try:
                        async with asyncio.timeout(2.0):
                            await lease.revoke()
                    except Exception:  # noqa: BLE001 - it expires by itself
                        pass
        finally:
            try:
                async with asyncio.timeout(2.0):
                    await client.close()
            except Exception:  # noqa: BLE001
                pass
