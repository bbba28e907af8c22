"""Pruning by retention (queue `prune`).

`prune(journal, dry_run=False)`:

1. read the journal's spec from etcd; no spec, or `fragment.retention <= 0` on a journal
   that is not a recovery log (label `content-type: application/x-quire-recoverylog`):
   nothing;
2. list every store of the spec (the store is authoritative);
3. read the guard offset `<root>/guards/<journal>` (decimal; the lowest offset a
   consumer shard or recovery log still needs; absent = no guard);
4. plan with fragment_store.prune.plan_prune. The head the planner protects is the
   end of the listed fragments: the fragment holding the newest persisted byte is never
   removed, and content not yet persisted is not in the listing at all, so it cannot be;
5. unless `dry_run`, delete the planned objects (`delete_many`: batched on S3, absent
   keys are not an error, so two runs at once both succeed and a run killed midway is
   simply finished by the next) and refresh the index, so coordinators and batch
   readers stop offering them; a read at a pruned offset then jumps to the first
   retained byte.

A recovery log is pruned up to its guard (the log offset of its shard's newest
snapshot) whatever its age or retention: fragment_store/prune.py.

`sweep()` (beat, every `QUIRE_WORKER_PRUNE_INTERVAL`, default 300 s) enqueues
`prune_journal` for every journal whose spec has a retention, and every recovery log.

Returns `{"journal", "dry_run", "removed": [{"key", "store", "begin", "end", "mod_time"}],
"first_retained"}` — the same plan whether dry or not.
"""

from __future__ import annotations

import time
from typing import Any

from fragment_store import fragment_key, list_fragments
from fragment_store.prune import plan_prune
from protocol import Fragment, JournalSpec
from protocol.labels import CONTENT_TYPE, RECOVERY_LOG
from protocol.logs import bind, get_logger
from workers import common
from workers.app import app
from fragment_store import StoreUnavailable
from workers.errors import MAINTENANCE_RETRY, RETRIABLE
from workers.index import refresh
from workers.topology import read_topology_sync, read_value_sync

__all__ = ["apply_capability", "guard_key", "prune", "prune_journal", "read_guard", "sweep"]

log = get_logger(__name__)


def guard_key(root: str, journal: str) -> str:
    """The etcd key consumers write the lowest offset they still need under."""
    return f"{root}/guards/{journal}"


def read_guard(etcd_url: str, root: str, journal: str, *, timeout: float = 10.0) -> int | None:
    """The guard offset of `journal`, or None if no consumer published one."""
    raw = read_value_sync(etcd_url, guard_key(root, journal), timeout=timeout)
    if raw is None:
        return None
    try:
        return int(raw.decode().strip())
    except ValueError:
        # An unreadable guard must not unlock deletion: treat it as "keep everything".
        log.warning("unreadable guard offset; pruning nothing", key=guard_key(root, journal))
        return 0


def apply_capability(journal: str) -> dict[str, str]:
    """With auth on, the `capability` argument a destructive task needs: an APPLY token
    on exactly `journal`, living DESTRUCTIVE_TTL (workers.signing checks it)."""
    from protocol.auth import Capability
    from protocol.credentials import settings_keyring
    from protocol.task_signing import DESTRUCTIVE_TTL

    ring = settings_keyring(common.settings())
    if ring is None:
        return {}
    return {"capability": ring.derive("quire-prune-sweep", Capability.APPLY, journal,
                                      DESTRUCTIVE_TTL)}


def is_recovery_log(spec: JournalSpec) -> bool:
    return RECOVERY_LOG in spec.labels.values(CONTENT_TYPE)


def _due(spec: JournalSpec) -> bool:
    return spec.fragment.retention > 0 or is_recovery_log(spec)


def _row(f: Fragment) -> dict[str, Any]:
    return {"key": fragment_key(f), "store": f.backing_store, "begin": f.begin, "end": f.end,
            "mod_time": f.mod_time}


def prune(journal: str, dry_run: bool = False, now: float | None = None) -> dict[str, Any]:
    """The task body, callable without Celery."""
    ws = common.worker_settings()
    s = common.settings()
    now = time.time() if now is None else now
    topo = read_topology_sync(s.etcd_url, s.etcd_root, timeout=ws.io_timeout, journal=journal)
    jt = topo.journals.get(journal)
    out: dict[str, Any] = {"journal": journal, "dry_run": dry_run, "removed": [],
                           "first_retained": 0}
    if jt is None or not _due(jt.spec):
        return out
    listed: list[Fragment] = []
    for url in jt.spec.fragment.stores:
        listed.extend(list_fragments(common.store(url), journal))
    head = max((f.end for f in listed), default=0)
    guard = read_guard(s.etcd_url, s.etcd_root, journal, timeout=ws.io_timeout)
    plan = plan_prune(listed, now=now, retention=jt.spec.fragment.retention, head=head,
                      guard=guard, recovery_log=is_recovery_log(jt.spec))
    out["removed"] = [_row(f) for f in plan.remove]
    out["first_retained"] = plan.first_retained
    if plan.remove and not dry_run:
        by_store: dict[str, list[str]] = {}
        for f in plan.remove:
            by_store.setdefault(f.backing_store, []).append(fragment_key(f))
        for url, keys in by_store.items():
            common.store(url).delete_many(keys)
        refresh(journal)
    log.info("prune", removed=len(plan.remove), first_retained=plan.first_retained,
             guard=guard, dry_run=dry_run)
    return out


@app.task(name="workers.prune.prune_journal", bind=True, autoretry_for=(*RETRIABLE, StoreUnavailable),
          retry_backoff=True, retry_backoff_max=60, retry_jitter=True, max_retries=5)
def prune_journal(self: Any, journal: str, dry_run: bool = False,
                  capability: str = "") -> dict[str, Any]:
    # `capability`: with auth on, an APPLY token on the journal, checked (with the
    # message's signature) by workers.signing before this body runs.
    with bind(journal=journal, task_id=self.request.id):
        return prune(journal, dry_run)


@app.task(name="workers.prune.sweep", bind=True, ignore_result=True, **MAINTENANCE_RETRY)
def sweep(self: Any) -> int:
    """Beat, every QUIRE_WORKER_PRUNE_INTERVAL: one prune_journal per journal whose
    spec has a retention and per recovery log (journals that keep forever cost nothing)."""
    ws = common.worker_settings()
    with common.sweep_topology("prune", ws.prune_interval) as topo:
        if topo is None:
            log.info("another prune sweep is running; skipping")
            return 0
        due = sorted(n for n, jt in topo.journals.items() if _due(jt.spec))
        for name in due:
            prune_journal.apply_async(args=[name], kwargs=apply_capability(name),
                                      expires=ws.prune_interval)
        log.info("prune sweep", journals=len(topo.journals), enqueued=len(due))
        return len(due)


def purge(journal: str, stores: list[str]) -> dict[str, Any]:
    """Remove every object of a deleted journal from `stores`: its fragments and its
    index manifest. Refuses if the journal has a spec again (re-created during the
    grace period). Objects of a live journal nested under this name (`a/b/c` under
    `a/b`) stay, and a neighbour whose name this one prefixes (`a/bc`) is never listed."""
    from fragment_store import manifest_key

    from workers.index import publish_index

    ws = common.worker_settings()
    s = common.settings()
    topo = read_topology_sync(s.etcd_url, s.etcd_root, timeout=ws.io_timeout)
    if journal in topo.journals:
        log.info("journal has a spec again; not purging")
        return {"journal": journal, "purged": False, "removed": 0}
    nested = tuple(n + "/" for n in topo.journals if n.startswith(journal + "/"))
    removed = 0
    for url in stores:
        st = common.store(url)
        keys = [fragment_key(f) for f in list_fragments(st, journal)]
        keys = [k for k in keys if not k.startswith(nested)] if nested else keys
        st.delete_many([*keys, manifest_key(journal)])
        removed += len(keys)
    publish_index(journal, None)
    log.info("purged", removed=removed, stores=len(stores))
    return {"journal": journal, "purged": True, "removed": removed}


@app.task(name="workers.prune.purge_journal", bind=True,
          autoretry_for=(*RETRIABLE, StoreUnavailable), retry_backoff=True,
          retry_backoff_max=60, retry_jitter=True, max_retries=5)
def purge_journal(self: Any, journal: str, stores: list[str],
                  capability: str = "") -> dict[str, Any]:
    with bind(journal=journal, task_id=self.request.id):
        return purge(journal, stores)
