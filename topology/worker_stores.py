"""The stores each live persist worker accepts, announced in etcd under its lease.

Key layout (beside the journal, member and job keys; Celery node names never contain '/'):

    <root>/workers/<node name>     WorkerStores JSON, under the worker's own lease

A worker writes its key when it starts and keeps the lease alive from its main process
(workers/announce.py); the key vanishes with the worker (revoked at shutdown, expired
after a kill). `quire journals apply` (tools/cli/store_check.py) reads these keys to
refuse or warn about a spec whose store no live worker writes to, and `quire doctor`
lists them. Nothing else reads them: coordinators ignore keys they do not know.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

__all__ = ["WORKER_TTL", "WorkerStores", "accepted_stores", "decode_worker", "list_worker_stores",
           "stores_accepted_by_none", "worker_key", "workers_prefix"]

WORKER_TTL = 20
"""Seconds of a worker announcement's lease: a killed worker's key lasts at most this."""


class WorkerStores(msgspec.Struct, frozen=True, kw_only=True):
    worker: str
    """The Celery node name (`celery@host`, or the `-n` given)."""
    stores: tuple[str, ...] = ()
    """QUIRE_STORE_URL then QUIRE_WORKER_STORES: the exact store URLs it writes to."""
    restricted: bool = True
    """False: the worker writes to any store a persist task names (auth off and no
    QUIRE_WORKER_STORES); True: only to `stores` (workers/persist.py check_store)."""
    auth: bool = False
    """The worker checks task signatures (the cluster runs with auth on)."""
    pid: int = 0
    started: float = 0.0

    def accepts(self, url: str) -> bool:
        return not self.restricted or url in self.stores


def _root(root: str) -> str:
    return root.rstrip("/")


def workers_prefix(root: str) -> str:
    return f"{_root(root)}/workers/"


def worker_key(root: str, name: str) -> str:
    if not name or "/" in name:
        raise ValueError(f"worker name {name!r} is empty or holds '/'")
    return workers_prefix(root) + name


_DECODER = msgspec.json.Decoder(WorkerStores)


def decode_worker(raw: bytes | str) -> WorkerStores:
    try:
        return _DECODER.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"malformed worker announcement {raw!r:.80}: {exc}") from None


async def list_worker_stores(client: Any, root: str) -> list[WorkerStores]:
    """The live workers' announcements (one range read; malformed values skipped)."""
    prefix = workers_prefix(root).encode()
    out = []
    for kv in await client.get_prefix(prefix):
        try:
            out.append(decode_worker(kv.value))
        except ValueError:
            continue
    return sorted(out, key=lambda w: w.worker)


def accepted_stores(workers: Iterable[WorkerStores]) -> list[str]:
    """Every store URL some restricted worker names (an unrestricted one takes any)."""
    return sorted({s for w in workers for s in w.stores})


def stores_accepted_by_none(urls: Iterable[str], workers: Iterable[WorkerStores]) -> list[str]:
    """Those of `urls` no worker in `workers` accepts (all of them when there is none)."""
    ws = list(workers)
    return [u for u in urls if not any(w.accepts(u) for w in ws)]
