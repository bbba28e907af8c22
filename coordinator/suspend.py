"""Journal suspension changes made by appends (Gazette's stateUpdateSuspend).

A suspended journal runs with fewer replicas: PARTIAL keeps one, FULL none (the spec's
`desired_replication()`), and its `suspend.offset` says where writing resumes. An
append decides what to do with it from its `suspend` field (digest §4, step 8):

* `resume` (the default): a suspended journal is resumed first — the spec is rewritten
  with level NONE, keeping an offset at least as far as anything written — and the
  append proceeds once the allocator has given the journal its replicas back;
* `no-resume`: a suspended journal answers SUSPENDED (pulses use it);
* `keep`: the suspension is left as it is (reset-head's empty append uses it).

The spec write compares the spec's and every assignment's ModRevision, so it can only
land on the topology the append resolved; a lost race re-resolves.

`SuspendStates` is the append FSM's side of it (a mixin of `AppendFSM`, as
append_sync.py's pipeline states are): RESOLVE of a journal without replicas, and the
write of a suspension decided by RESOLVE or VALIDATE_PRECONDITIONS.
"""

from __future__ import annotations

import time
from typing import Any

import aetcd
import msgspec

from protocol import Suspend, SuspendLevel
from protocol.errors import EtcdTransactionFailed, JournalNotFound, QuireError

from .append_rules import Decision, State, decide_suspended
from topology.etcd import assignment_key, cmp_mod, journal_key, put_op, txn
from topology.keyspace import KeySpace

__all__ = ["RESUME_TIMEOUT", "SuspendStates", "update_suspend"]

RESUME_TIMEOUT = 30.0
"""How long a resumed append waits for the allocator to give the journal its replicas."""


async def update_suspend(client: aetcd.Client, keyspace: KeySpace, journal: str,
                         suspend: Suspend) -> int:
    """Write `suspend` into the journal's spec; return the etcd revision of the write."""
    entry = keyspace.journals.get(journal)
    if entry is None:
        raise JournalNotFound(f"journal {journal!r} does not exist")
    root = keyspace.root
    spec = msgspec.structs.replace(entry.spec, suspend=suspend)
    key = journal_key(root, journal)
    compares = [cmp_mod(key, entry.mod_revision)]
    compares += [cmp_mod(assignment_key(root, a.journal, a.member, a.slot), a.mod_revision)
                 for a in keyspace.assignments(journal)]
    result = await txn(client, compares, [put_op(key, msgspec.json.encode(spec))])
    if not result.succeeded:
        raise EtcdTransactionFailed(
            f"{journal}: spec or assignments changed before revision {result.revision}")
    return result.revision


class SuspendStates:
    """Mixin: needs AppendFSM's attributes and `_go` / `_release_pipeline` / `_log`."""

    broker: Any
    req: Any
    state: State
    read_through: int
    _resolves: int
    _suspend: Suspend | None
    _resumed_until: float

    def _go(self, decision: Decision | State) -> None: ...
    async def _release_pipeline(self) -> None: ...
    @property
    def _log(self) -> Any: ...

    async def _resolve_unassigned(self, res: Any) -> bool:
        """A journal without replicas: FULL-suspended (resume it first, or refuse), or one
        we just resumed that the allocator has not re-assigned yet (wait, bounded)."""
        d = decide_suspended(res.spec.suspend.level, self.req.suspend, res.spec.suspend.offset)
        if d is not None and d.state is State.ERROR:
            self._go(d)
            return True
        if d is not None:
            self._suspend = d.suspend
            await self._update_suspend()
            return True
        remaining = self._resumed_until - time.monotonic()
        if remaining > 0:
            await self.broker.keyspace.wait_changed(res.header.etcd.revision, remaining)
            self._resolves -= 1  # waiting for the allocator is not a failed resolution
            return True
        return False

    async def _update_suspend(self) -> None:
        """Write the decided suspension into the spec, then resolve at that revision."""
        suspend, self._suspend = self._suspend, None
        assert suspend is not None
        await self._release_pipeline()  # the route is about to change: let pulses run
        try:
            rev = await self.broker.update_suspend(self.req.journal, suspend)
        except QuireError as exc:
            # The spec or route moved since we resolved: decide again on the new one.
            self._log.info("updating the suspension failed; re-resolving", error=str(exc))
            rev = self.broker.keyspace.revision + 1
        else:
            self._log.info("journal suspension updated", level=suspend.level.value,
                           offset=suspend.offset, revision=rev)
            if suspend.level == SuspendLevel.NONE:
                self._resumed_until = time.monotonic() + RESUME_TIMEOUT
        self.read_through = max(self.read_through, rev)
        if self.state is not State.RESOLVE:
            self._go(State.RESOLVE)
