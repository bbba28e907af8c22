"""Applying many specs straight to etcd in transactions that fit its limits (shard specs,
job specs): read what is stored under the prefix, plan, cut and run the chunks with
protocol/apply_chunks.py, one guarded transaction per chunk.

Journal specs take the same plan and chunks through the client library (a coordinator
writes each chunk: quire/client/chunked.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aetcd
import msgspec
from aetcd import rpc

from protocol.apply_chunks import (
    MAX_TXN_BYTES,
    MAX_TXN_OPS,
    ApplyResult,
    Edit,
    chunk,
    plan,
    run_chunks,
)
from protocol.errors import EtcdTransactionFailed

from .etcd import cmp_mod, cmp_version, delete_op, prefix_end, put_op, range_op, txn

__all__ = ["apply_edits", "read_prefix"]


async def read_prefix(client: aetcd.Client, prefix: str,
                      decode: Callable[[str, bytes], Any]) -> tuple[dict[str, tuple[Any, int]], int]:
    """{name (the key after `prefix`): (decoded value or None if unreadable, mod revision)}
    of every key under `prefix`, and the etcd revision it was read at."""
    start = prefix.encode()
    result = await txn(client, [], [rpc.RequestOp(request_range=rpc.RangeRequest(
        key=start, range_end=prefix_end(start)))])
    out: dict[str, tuple[Any, int]] = {}
    for kv in result.responses[0].response_range.kvs:
        name = kv.key.decode()[len(prefix):]
        try:
            value = decode(name, kv.value)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError):
            value = None
        out[name] = (value, kv.mod_revision)
    return out, result.revision


async def apply_edits(client: aetcd.Client, prefix: str, edits: Sequence[Edit],
                      decode: Callable[[str, bytes], Any], *, what: str,
                      max_txn_size: int = MAX_TXN_OPS, max_txn_bytes: int = MAX_TXN_BYTES,
                      extra_ops: Callable[[Edit], list[Any]] | None = None,
                      progress: Callable[[int, ApplyResult], Awaitable[None] | None] | None = None,
                      ) -> ApplyResult:
    """Apply `edits` (values are msgspec structs, keyed `prefix + name`) in chunks: one
    transaction each, guarded by the revisions planned (docs/operations.md). Unchanged
    specs are skipped; `extra_ops(edit)` adds operations to a delete's transaction
    (counted against the chunk's size). ApplyIncomplete names what was and was not
    applied when a chunk fails part-way."""
    current, read_at = await read_prefix(client, prefix, decode)
    planned = plan(edits, current)
    per_edit = 1 + (1 if extra_ops is not None else 0)
    chunks = chunk(planned.pending, max(1, max_txn_size // per_edit), max_txn_bytes)

    async def write(part: Sequence[Edit]) -> int:
        compares, ops = [], []
        for edit in part:
            key = prefix + edit.name
            compares.append(cmp_version(key, 0) if edit.expect == 0 else cmp_mod(key, edit.expect))
            if edit.is_delete:
                ops.append(delete_op(key))
                if extra_ops is not None:
                    ops.extend(extra_ops(edit))
            else:
                ops.append(put_op(key, msgspec.json.encode(edit.value)))
        # On a failed compare, read the keys back (keys only) to name the stale ones.
        result = await txn(client, compares, ops,
                           [range_op(prefix + e.name) for e in part])
        if not result.succeeded:
            stale = [e.name for e, resp in zip(part, result.responses, strict=True)
                     if _revision(resp) != max(e.expect, 0)]
            raise EtcdTransactionFailed(
                f"{what} {', '.join(stale[:5]) or '?'}{' …' if len(stale) > 5 else ''} changed "
                f"since read (etcd revision {result.revision}); nothing of this transaction "
                "was written")
        return result.revision

    result = await run_chunks(chunks, write, unchanged=planned.unchanged, what=what,
                              progress=progress)
    return result if result.transactions else ApplyResult((), result.unchanged, read_at, 0)


def _revision(resp: Any) -> int:
    kvs = resp.response_range.kvs
    return int(kvs[0].mod_revision) if kvs else 0
