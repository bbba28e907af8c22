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
"""

from __future__ import annotations

import aetcd
import msgspec

from quire.protocol import Suspend
from quire.protocol.errors import EtcdTransactionFailed, JournalNotFound

from .etcd import assignment_key, cmp_mod, journal_key, put_op, txn
from .keyspace import KeySpace

__all__ = ["update_suspend"]


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
