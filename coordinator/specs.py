"""Apply and List of journal specs against etcd (Gazette's list_apply_api.go).

Apply validates every change before writing anything, then writes all of them in one
transaction guarded by each change's expected ModRevision: 0 = must not exist, > 0 =
must be at that revision, -1 = no check. A failed compare writes nothing and raises
EtcdTransactionFailed, so concurrent editors with stale revisions cannot clobber each
other. Values are msgspec JSON, readable with `etcdctl get --prefix <root>/journals/`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import aetcd
import msgspec

from protocol import JournalSpec, LabelSelector, ValidationError
from protocol.errors import EtcdTransactionFailed
from protocol.messages import ApplyChange, ListEntry
from protocol.names import validate_journal_name
from protocol.wire import MAX_HEADER

from topology.assignments import route_of
from topology.etcd import (
    assign_prefix,
    cmp_mod,
    cmp_version,
    delete_op,
    journal_key,
    journals_prefix,
    parse_assignment_key,
    put_op,
    range_op,
    txn,
)
from topology.keyspace import Assignment

__all__ = ["PAGE_BYTES", "apply_specs", "list_page", "list_specs", "list_specs_at", "validate_changes"]


def validate_changes(changes: Sequence[ApplyChange]) -> None:
    """Raise ValidationError (with the change's index in the path) on the first bad change."""
    if not changes:
        raise ValidationError("changes", "at least one change is required")
    seen: set[str] = set()
    for i, ch in enumerate(changes):
        path = f"changes[{i}]"
        if (ch.upsert is None) == (not ch.delete):
            raise ValidationError(path, "exactly one of upsert or delete must be set")
        if ch.expect_mod_revision < -1:
            raise ValidationError(f"{path}.expect_mod_revision",
                                  f"{ch.expect_mod_revision} (expected -1, 0 or a revision)")
        if ch.upsert is not None:
            ch.upsert.validate(f"{path}.upsert")
            name = ch.upsert.name
        else:
            validate_journal_name(ch.delete, f"{path}.delete")
            name = ch.delete
            if ch.expect_mod_revision == 0:
                raise ValidationError(f"{path}.expect_mod_revision",
                                      "a delete needs the journal's revision (or -1)")
        if name in seen:
            raise ValidationError(path, f"journal {name!r} appears in more than one change")
        seen.add(name)


Guard = Callable[[list[tuple[str, JournalSpec | None, JournalSpec | None]]], None]


async def apply_specs(client: aetcd.Client, root: str, changes: Sequence[ApplyChange],
                      guard: Guard | None = None) -> int:
    """Apply all changes atomically; returns the etcd revision of the write.

    `guard` (auth) is shown each change as (name, current spec, new spec) and raises to
    refuse; the transaction is then pinned to the revisions the current specs were read
    at, so what was authorized is exactly what is replaced."""
    validate_changes(changes)
    compares, ops = [], []
    read: dict[str, int] = {}
    if guard is not None:
        read = await _guarded(client, root, changes, guard)
    for ch in changes:
        name = ch.upsert.name if ch.upsert is not None else ch.delete
        key = journal_key(root, name)
        if name in read:
            # One compare per key (etcd counts compares against --max-txn-ops): the
            # revision the guard read, which an expected revision must equal.
            if ch.expect_mod_revision not in (-1, read[name]):
                raise EtcdTransactionFailed(f"journal {name!r} is at revision {read[name]}, "
                                            f"not {ch.expect_mod_revision}")
            compares.append(cmp_version(key, 0) if read[name] == 0 else cmp_mod(key, read[name]))
        elif ch.expect_mod_revision == 0:
            compares.append(cmp_version(key, 0))
        elif ch.expect_mod_revision > 0:
            compares.append(cmp_mod(key, ch.expect_mod_revision))
        if ch.upsert is not None:
            ops.append(put_op(key, msgspec.json.encode(ch.upsert)))
        else:
            ops.append(delete_op(key))
    result = await txn(client, compares, ops)
    if not result.succeeded:
        raise EtcdTransactionFailed(
            f"a journal's revision differs from the expected one (etcd revision {result.revision})")
    return result.revision


async def _guarded(client: aetcd.Client, root: str, changes: Sequence[ApplyChange],
                   guard: Guard) -> dict[str, int]:
    """Show the guard each change; {name: mod revision read (0 = absent)} to pin to."""
    names = [ch.upsert.name if ch.upsert is not None else ch.delete for ch in changes]
    result = await txn(client, [], [range_op(journal_key(root, n)) for n in names])
    seen, pins = [], {}
    for name, ch, resp in zip(names, changes, result.responses):
        kvs = resp.response_range.kvs
        current = None
        if kvs:
            try:
                current = msgspec.json.decode(kvs[0].value, type=JournalSpec)
            except (msgspec.DecodeError, msgspec.ValidationError):
                current = None  # unreadable: authorized by name alone
            pins[name] = kvs[0].mod_revision
        else:
            pins[name] = 0
        seen.append((name, current, ch.upsert))
    guard(seen)
    return pins


PAGE_BYTES = MAX_HEADER // 2
"""A paged List response's entries stop short of this many bytes (a frame's header holds
at most MAX_HEADER)."""


def list_page(entries: list[ListEntry], limit: int) -> tuple[list[ListEntry], str]:
    """The first page of `entries` (sorted by name) and the token of the next one ("" if
    none): at most `limit` entries and about PAGE_BYTES; every entry when `limit` is 0."""
    if limit <= 0:
        return entries, ""
    size = 0
    for i, entry in enumerate(entries):
        size += len(msgspec.msgpack.encode(entry))
        if i >= limit or (i > 0 and size > PAGE_BYTES):
            return entries[:i], entries[i - 1].spec.name
    return entries, ""


async def list_specs(client: aetcd.Client, root: str,
                     selector: LabelSelector | None = None) -> list[ListEntry]:
    """Specs matching `selector`, with their routes, sorted by name."""
    entries, _ = await list_specs_at(client, root, selector)
    return entries


async def list_specs_at(client: aetcd.Client, root: str,
                        selector: LabelSelector | None = None) -> tuple[list[ListEntry], int]:
    """Specs matching `selector` (with their routes) and the etcd revision they were read at.

    Journals and assignments are read in one transaction so routes match the specs.
    """
    result = await txn(client, [], [range_op(journals_prefix(root), prefix=True),
                                    range_op(assign_prefix(root), prefix=True)])
    journals_kvs = result.responses[0].response_range.kvs
    assign_kvs = result.responses[1].response_range.kvs
    by_journal: dict[str, list[Assignment]] = {}
    for kv in assign_kvs:
        try:
            journal, pid, slot = parse_assignment_key(root, kv.key.decode())
        except ValueError:
            continue
        by_journal.setdefault(journal, []).append(
            Assignment(journal, pid, slot, None, kv.mod_revision, kv.create_revision, kv.lease))
    out: list[ListEntry] = []
    for kv in journals_kvs:
        try:
            spec = msgspec.json.decode(kv.value, type=JournalSpec)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue  # the KeySpace logs malformed values; a listing just omits them
        if selector is not None and not selector.matches_journal(spec.name, spec.labels):
            continue
        out.append(ListEntry(spec=spec, mod_revision=kv.mod_revision,
                             create_revision=kv.create_revision,
                             route=route_of(by_journal.get(spec.name, []))))
    return out, result.revision
