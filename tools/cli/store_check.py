"""Before `quire journals apply`: does a live worker write to each spec's store?

A journal's closed fragments go to its `fragment.stores[0]`; a persist worker writes only
to the stores it announces (topology/worker_stores.py: QUIRE_STORE_URL and
QUIRE_WORKER_STORES when it runs with auth on or with a list; any store otherwise). A spec
whose store no live worker accepts would be acknowledged and never persisted, so:

* with auth on (any live worker checks signatures) the apply is refused (exit 7),
* with auth off it goes ahead with a warning on stderr,

and both name the stores the live workers do accept. With no live worker announced, or
etcd unreadable here, the check says so on stderr and lets the apply go on: a worker may
start later, and the coordinator still validates the spec itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from protocol import ApplyChange
from protocol.discovery import effective_env
from topology.etcd import connect
from topology.etcd_client import EtcdTLS
from topology.worker_stores import WorkerStores, accepted_stores, list_worker_stores

from .common import EXIT_INVALID, CliError, settings, stderr

__all__ = ["StoreProblem", "check_spec_stores", "find_problems"]

TIMEOUT = 5.0
"""Seconds to read the workers' announcements before the check gives up (and says so)."""


class StoreProblem(CliError):
    """A spec names a store no live worker writes to (auth on)."""


def _stores_of(changes: Iterable[ApplyChange]) -> dict[str, str]:
    """journal -> the store its persist tasks go to, for the upserts that name one."""
    return {c.upsert.name: c.upsert.fragment.stores[0] for c in changes
            if c.upsert is not None and c.upsert.fragment.stores}


def find_problems(stores: dict[str, str], workers: list[WorkerStores]) -> dict[str, str]:
    """journal -> store, for the journals whose store no worker in `workers` accepts."""
    return {j: s for j, s in stores.items() if not any(w.accepts(s) for w in workers)}


def describe(problems: dict[str, str], workers: list[WorkerStores]) -> str:
    by_store: dict[str, list[str]] = {}
    for journal, store in sorted(problems.items()):
        by_store.setdefault(store, []).append(journal)
    named = "; ".join(f"{store} (journal{'s' if len(js) > 1 else ''} {', '.join(js[:5])}"
                      f"{', …' if len(js) > 5 else ''})" for store, js in by_store.items())
    accepted = accepted_stores(workers)
    return (f"no live worker persists to {named}: its fragments would stay on the "
            f"coordinators' disks. The live workers ({len(workers)}) accept: "
            f"{', '.join(accepted) if accepted else '(none listed)'} — use one of them in "
            "fragment.stores, or add the store to the workers' QUIRE_WORKER_STORES")


async def _read(url: str, root: str) -> list[WorkerStores]:
    client = await asyncio.wait_for(
        connect(url, probe=TIMEOUT / 2, tls=EtcdTLS.from_env(effective_env())), TIMEOUT)
    try:
        return await asyncio.wait_for(list_worker_stores(client, root), TIMEOUT)
    finally:
        await client.close()


def check_spec_stores(changes: Iterable[ApplyChange], *, workers: list[WorkerStores] | None = None,
                      reader: Any = None) -> None:
    """Refuse (auth on) or warn (auth off) when a spec's store has no live worker."""
    stores = _stores_of(changes)
    if not stores:
        return
    if workers is None:
        s = settings()
        try:
            workers = asyncio.run((reader or _read)(s.etcd_url, s.etcd_root))
        except Exception as exc:  # noqa: BLE001 - the check is advisory when it cannot read
            stderr.print(f"warning: could not read the workers' stores from etcd at {s.etcd_url} "
                         f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); "
                         "the specs' stores are not checked", markup=False, highlight=False)
            return
    if not workers:
        stderr.print("warning: no live worker has announced the stores it writes to; "
                     "cannot check the specs' stores (start a worker: fragments persist "
                     "only once one runs)", markup=False, highlight=False)
        return
    problems = find_problems(stores, workers)
    if not problems:
        return
    text = describe(problems, workers)
    if any(w.auth for w in workers):
        raise StoreProblem(f"refused: {text}", EXIT_INVALID)
    stderr.print(f"warning: {text}", markup=False, highlight=False)
