"""Apply of many journal specs: read what is stored, skip what is unchanged, and send the
rest as ApplyRequests that each fit one etcd transaction (protocol/apply_chunks.py).

A coordinator writes one ApplyRequest in one transaction, guarded by each change's
expected revision; here every change without a revision of its own is pinned to the one
it was read at, so each chunk is atomic and checked against what was read. The current
specs are read in List pages of at most READ_BATCH names (a bounded response however
many journals the cluster holds).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec

from protocol import (
    ApplyChange,
    ApplyRequest,
    ApplyResponse,
    JournalSpec,
    LabelSelector,
    LabelSet,
    ListRequest,
    ListResponse,
)
from protocol.apply_chunks import MAX_TXN_BYTES, MAX_TXN_OPS, ApplyResult, Edit, chunk, plan, run_chunks
from protocol.errors import ValidationError

READ_BATCH = 200
"""Journal names per List request when reading the current specs."""

Progress = Callable[[int, ApplyResult], Awaitable[None] | None]


def edits_of(changes: Sequence[ApplyChange]) -> list[Edit]:
    """Validated edits, one per journal (a journal named twice is refused)."""
    seen: set[str] = set()
    out: list[Edit] = []
    for i, ch in enumerate(changes):
        if (ch.upsert is None) == (not ch.delete):
            raise ValidationError(f"changes[{i}]", "exactly one of upsert or delete must be set")
        name = ch.upsert.name if ch.upsert is not None else ch.delete
        if name in seen:
            raise ValidationError(f"changes[{i}]", f"journal {name!r} appears in more than one change")
        seen.add(name)
        size = len(msgspec.json.encode(ch.upsert)) if ch.upsert is not None else 0
        out.append(Edit(name, ch.upsert, ch.expect_mod_revision, size, ch))
    return out


def fits_one(edits: Sequence[Edit], max_txn_size: int, max_txn_bytes: int) -> bool:
    return len(chunk(edits, max_txn_size, max_txn_bytes)) <= 1


async def current_specs(calls: Any, names: Sequence[str],
                        batch: int = READ_BATCH) -> dict[str, tuple[JournalSpec, int]]:
    """{name: (spec, mod revision)} of those of `names` that exist."""
    out: dict[str, tuple[JournalSpec, int]] = {}
    for i in range(0, len(names), batch):
        part = names[i:i + batch]
        selector = LabelSelector(include=LabelSet.of({"name": part}))
        response = await calls.unary(ListRequest(selector=selector), ListResponse)
        wanted = set(part)
        for entry in response.journals:
            if entry.spec.name in wanted:
                out[entry.spec.name] = (entry.spec, entry.mod_revision)
    return out


async def apply_chunked(calls: Any, changes: Sequence[ApplyChange], *,
                        max_txn_size: int = MAX_TXN_OPS, max_txn_bytes: int = MAX_TXN_BYTES,
                        progress: Progress | None = None) -> ApplyResult:
    """Plan, cut and apply (module doc). ApplyIncomplete when a chunk fails part-way."""
    edits = edits_of(changes)
    for edit in edits:
        if edit.value is not None:
            edit.value.validate()
    current = await current_specs(calls, [e.name for e in edits])
    planned = plan(edits, current)
    chunks = chunk(planned.pending, max_txn_size, max_txn_bytes)

    async def write(part: Sequence[Edit]) -> int:
        request = ApplyRequest(changes=tuple(_pinned(e) for e in part))
        response = await calls.unary(request, ApplyResponse, idempotent=False)
        calls.applied_revision = max(calls.applied_revision, response.revision)
        return response.revision

    return await run_chunks(chunks, write, unchanged=planned.unchanged, what="journal",
                            progress=progress)


def _pinned(edit: Edit) -> ApplyChange:
    change: Any = edit.item
    return ApplyChange(upsert=change.upsert, delete=change.delete, expect_mod_revision=edit.expect)
