"""Shard keys in etcd: specs, primary locks, status reports, checkpoint notices, guards.

Key layout (beside the journal keys of etcd.py; shard ids never contain '#'):

    <root>/shards/<id>                              ShardSpec JSON, no lease
    <root>/consumers/members/<zone>#<suffix>        consumer member (BrokerSpec), its lease
    <root>/consumers/primary/<id>                   "<zone>#<suffix>": the shard's exclusive
                                                    lock, created only if absent, under the
                                                    holder's lease (at most one primary)
    <root>/consumers/status/<id>#<zone>#<suffix>    ShardStatus JSON, the reporter's lease
    <root>/consumers/notice/<id>                    checkpoint notice (unix time), no lease
    <root>/consumers/needs/<id>                     {journal: offset} the shard's newest
                                                    snapshot still needs, no lease
    <root>/guards/<journal>                         decimal: lowest offset a shard still
                                                    needs (read by the prune task)

Consumer members announce under `<root>/consumers` (Membership's own `members/` below
it), so the journal allocator, which watches `<root>/members/`, never sees them.

Both the CLI (`quire shards …`) and the consumers role use these helpers; neither has to
know the other.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import aetcd
import msgspec

from protocol import ProcessId
from protocol.errors import EtcdTransactionFailed, ShardNotFound, ValidationError
from protocol.shard import ShardSpec, ShardStatus, validate_shard_id

from protocol.apply_chunks import MAX_TXN_BYTES, MAX_TXN_OPS, ApplyResult, Edit

from .etcd import (
    MalformedKey,
    cmp_mod,
    cmp_version,
    delete_op,
    prefix_end,
    put_op,
    txn,
)
from .spec_apply import apply_edits

__all__ = [
    "ShardChange",
    "ShardEntry",
    "ShardNotFound",
    "apply_shards",
    "consumer_root",
    "delete_shard",
    "get_shard",
    "guard_key",
    "list_shards",
    "list_statuses",
    "needs_key",
    "needs_prefix",
    "publish_needs",
    "notice_key",
    "notice_prefix",
    "primary_key",
    "primary_prefix",
    "read_primaries",
    "request_checkpoint",
    "shard_key",
    "shards_prefix",
    "status_key",
    "status_prefix",
]


def _root(root: str) -> str:
    return root.rstrip("/")


def shards_prefix(root: str) -> str:
    return f"{_root(root)}/shards/"


def shard_key(root: str, shard_id: str) -> str:
    return shards_prefix(root) + shard_id


def consumer_root(root: str) -> str:
    """The root consumer members announce under (Membership appends `/members/`)."""
    return f"{_root(root)}/consumers"


def primary_prefix(root: str) -> str:
    return f"{consumer_root(root)}/primary/"


def primary_key(root: str, shard_id: str) -> str:
    return primary_prefix(root) + shard_id


def status_prefix(root: str) -> str:
    return f"{consumer_root(root)}/status/"


def status_key(root: str, shard_id: str, member: ProcessId) -> str:
    return f"{status_prefix(root)}{shard_id}#{member.zone}#{member.suffix}"


def notice_prefix(root: str) -> str:
    return f"{consumer_root(root)}/notice/"


def notice_key(root: str, shard_id: str) -> str:
    return notice_prefix(root) + shard_id


def needs_prefix(root: str) -> str:
    return f"{consumer_root(root)}/needs/"


def needs_key(root: str, shard_id: str) -> str:
    return needs_prefix(root) + shard_id


def guard_key(root: str, journal: str) -> str:
    """Same key workers/prune.py reads."""
    return f"{_root(root)}/guards/{journal}"


@dataclass(frozen=True, slots=True)
class ShardEntry:
    spec: ShardSpec
    mod_revision: int


@dataclass(frozen=True, slots=True)
class ShardChange:
    """An upsert (`spec`) or a delete (`delete` = id). expect_mod_revision: -1 = no
    check, 0 = must not exist, > 0 = must still be at that mod revision."""

    spec: ShardSpec | None = None
    delete: str = ""
    expect_mod_revision: int = -1

    @property
    def shard_id(self) -> str:
        return self.spec.id if self.spec is not None else self.delete


def decode_spec(key: str, value: bytes, root: str) -> ShardSpec:
    shard_id = key[len(shards_prefix(root)):]
    spec = msgspec.json.decode(value, type=ShardSpec)
    if spec.id != shard_id:
        raise MalformedKey(f"shard spec id {spec.id!r} differs from its key {key!r}")
    return spec


async def list_shards(client: aetcd.Client, root: str) -> list[ShardEntry]:
    """Every decodable ShardSpec, sorted by id (malformed values are skipped)."""
    prefix = shards_prefix(root).encode()
    out: list[ShardEntry] = []
    for kv in (await client.get_prefix(prefix)).kvs:
        try:
            out.append(ShardEntry(decode_spec(kv.key.decode(), kv.value, root), kv.mod_revision))
        except (msgspec.DecodeError, msgspec.ValidationError, MalformedKey):
            continue
    return sorted(out, key=lambda e: e.spec.id)


async def get_shard(client: aetcd.Client, root: str, shard_id: str) -> ShardEntry:
    validate_shard_id(shard_id, "id")
    got = await client.get(shard_key(root, shard_id).encode())
    if got is None:
        raise ShardNotFound(f"no shard {shard_id!r}")
    return ShardEntry(decode_spec(got.key.decode(), got.value, root), got.mod_revision)


async def apply_shards(client: aetcd.Client, root: str, changes: Iterable[ShardChange], *,
                       max_txn_size: int = MAX_TXN_OPS, max_txn_bytes: int = MAX_TXN_BYTES,
                       progress: Any = None) -> ApplyResult:
    """Validate every change, then apply them in transactions that fit etcd's limits
    (topology/spec_apply.py): each is atomic and guarded by the revisions read, a spec
    equal to the stored one (or a delete of an absent shard) is left unchanged, and a
    failure part-way raises ApplyIncomplete naming what was and was not applied. Changes
    that fit one transaction are all or none, as before.

    Raises ValidationError (field-named) before writing anything, and
    EtcdTransactionFailed when an expected revision did not hold.
    """
    items = list(changes)
    seen: set[str] = set()
    edits: list[Edit] = []
    for i, change in enumerate(items):
        if (change.spec is None) == (not change.delete):
            raise ValidationError(f"[{i}]", "a change is exactly one of an upsert or a delete")
        if change.spec is not None:
            try:
                change.spec.validate()
            except ValidationError as exc:
                raise exc.within(f"[{i}]" if len(items) > 1 else "") from None
        else:
            validate_shard_id(change.delete, f"[{i}].delete")
        if change.shard_id in seen:
            raise ValidationError(f"[{i}]", f"shard {change.shard_id!r} is changed twice")
        seen.add(change.shard_id)
        size = len(msgspec.json.encode(change.spec)) if change.spec is not None else 0
        edits.append(Edit(change.shard_id, change.spec, change.expect_mod_revision, size, change))
    prefix = shards_prefix(root)
    return await apply_edits(client, prefix, edits,
                             lambda name, value: decode_spec(prefix + name, value, root),
                             what="shard", max_txn_size=max_txn_size,
                             max_txn_bytes=max_txn_bytes, progress=progress)


def _exists(key: str):  # type: ignore[no-untyped-def]
    from aetcd import rpc

    return rpc.Compare(key=key.encode(), target=rpc.Compare.VERSION, result=rpc.Compare.GREATER,
                       version=0)


async def delete_shard(client: aetcd.Client, root: str, shard_id: str,
                       expect_mod_revision: int = -1) -> int:
    """Delete a spec (ShardNotFound if absent), its notice, and its needs record (so it no
    longer holds back pruning; guards are recomputed by the next shard's snapshot)."""
    validate_shard_id(shard_id, "id")
    key = shard_key(root, shard_id)
    compares = [cmp_mod(key, expect_mod_revision)] if expect_mod_revision > 0 else [_exists(key)]
    result = await txn(client, compares, [delete_op(key), delete_op(notice_key(root, shard_id)),
                                          delete_op(needs_key(root, shard_id))])
    if not result.succeeded:
        if expect_mod_revision > 0:
            raise EtcdTransactionFailed(f"shard {shard_id!r} changed since revision "
                                        f"{expect_mod_revision}")
        raise ShardNotFound(f"no shard {shard_id!r}")
    return result.revision


async def request_checkpoint(client: aetcd.Client, root: str, shard_id: str) -> int:
    """Write a checkpoint notice; the primary commits at its next message boundary."""
    await get_shard(client, root, shard_id)
    result = await txn(client, [], [put_op(notice_key(root, shard_id), f"{time.time():.6f}".encode())])
    return result.revision


async def read_primaries(client: aetcd.Client, root: str) -> dict[str, tuple[str, int]]:
    """shard id -> (holder "<zone>#<suffix>", create revision) of every primary lock."""
    prefix = primary_prefix(root)
    out: dict[str, tuple[str, int]] = {}
    for kv in (await client.get_prefix(prefix.encode())).kvs:
        out[kv.key.decode()[len(prefix):]] = (kv.value.decode(), kv.create_revision)
    return out


async def list_statuses(client: aetcd.Client, root: str) -> dict[str, list[ShardStatus]]:
    """shard id -> every member's status report for it."""
    prefix = status_prefix(root)
    out: dict[str, list[ShardStatus]] = {}
    for kv in (await client.get_prefix(prefix.encode())).kvs:
        try:
            status = msgspec.json.decode(kv.value, type=ShardStatus)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        out.setdefault(status.id, []).append(status)
    return out


async def publish_needs(client: aetcd.Client, root: str, shard_id: str, needs: dict[str, int],
                        attempts: int = 8) -> dict[str, int]:
    """Record what a shard still needs ({journal: lowest offset}) and set each of those
    journals' prune guard to the lowest offset *any* shard needs, in one transaction
    guarded on every needs record read (so two shards sharing a source never lower or
    raise each other's guard wrongly). Returns the guards written."""
    own = needs_key(root, shard_id)
    for _ in range(attempts):
        resp = await client.get_prefix(needs_prefix(root).encode())
        others: dict[str, list[int]] = {}
        compares = []
        seen_own = False
        for kv in resp.kvs:
            key = kv.key.decode()
            compares.append(cmp_mod(key, kv.mod_revision))
            if key == own:
                seen_own = True
                continue
            try:
                theirs = msgspec.json.decode(kv.value, type=dict[str, int])
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
            for journal, offset in theirs.items():
                others.setdefault(journal, []).append(offset)
        if not seen_own:
            compares.append(cmp_version(own, 0))
        guards = {j: min([o, *others.get(j, [])]) for j, o in needs.items()}
        ops = [put_op(own, msgspec.json.encode(needs))]
        ops += [put_op(guard_key(root, j), str(o).encode()) for j, o in sorted(guards.items())]
        result = await txn(client, compares, ops)
        if result.succeeded:
            return guards
    raise EtcdTransactionFailed(f"shard {shard_id}: needs records kept changing; guards not written")


def range_end(prefix: str) -> bytes:
    return prefix_end(prefix.encode())
