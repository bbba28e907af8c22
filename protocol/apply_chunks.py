"""Applying many specs in transactions that fit etcd's limits: the one place that plans,
cuts and runs a large apply (journals through the client, shards and jobs straight to
etcd; docs/operations.md "Applying thousands of specs").

etcd refuses a transaction with more than `--max-txn-ops` compares or operations (128 by
default) or a request over `--max-request-bytes` (1.5 MiB by default). An apply of many
specs is therefore:

1. **planned** against what etcd holds (`plan`): a spec already equal to the stored one,
   or a delete of an absent key, is *unchanged* and not written (so applying the same
   file twice changes nothing the second time); every other change without a revision
   of its own is pinned to the revision it was read at (0 when absent);
2. **cut** into chunks of at most `max_ops` changes and about `max_bytes` bytes (`chunk`);
3. **run** chunk by chunk (`run_chunks`): each chunk is one transaction, atomic and
   checked against the revisions its changes carry. The first chunk that fails stops
   the apply with `ApplyIncomplete`, which names what was applied (earlier chunks) and
   what was not (this chunk and the later ones). Re-running the same file finishes the
   work: what was applied is now unchanged, the rest is planned again.

Pure: no etcd, no wire. Callers read the current state and write a chunk their own way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import QuireError, ValidationError

__all__ = [
    "ApplyIncomplete",
    "ApplyResult",
    "Edit",
    "MAX_REQUEST_BYTES",
    "MAX_TXN_BYTES",
    "MAX_TXN_OPS",
    "Plan",
    "chunk",
    "check_limits",
    "plan",
    "run_chunks",
]

MAX_TXN_OPS = 128
"""etcd's default --max-txn-ops: compares, and operations, per transaction."""
MAX_REQUEST_BYTES = 3 << 19
"""etcd's default --max-request-bytes (1.5 MiB)."""
MAX_TXN_BYTES = MAX_REQUEST_BYTES - (64 << 10)
"""What a chunk's keys and values may add up to: etcd's limit less room for the
request's own framing."""
_OP_OVERHEAD = 32
"""Bytes counted per change beyond its key (twice: compare and put) and value."""


@dataclass(frozen=True, slots=True)
class Edit:
    """One key's wanted state: `value` (any ==-comparable object; None = delete) with its
    encoded `size` in bytes, and `expect`: -1 = no check, 0 = must not exist, > 0 = must
    still be at that mod revision. `item` is the caller's own change, carried through."""

    name: str
    value: Any = None
    expect: int = -1
    size: int = 0
    item: Any = None

    @property
    def is_delete(self) -> bool:
        return self.value is None


@dataclass(frozen=True, slots=True)
class Plan:
    pending: tuple[Edit, ...]
    """Changes to write, each pinned to the revision it must find."""
    unchanged: tuple[str, ...]
    """Names already as wanted (equal spec, or a delete of an absent key)."""


@dataclass(frozen=True, slots=True)
class ApplyResult:
    applied: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    revision: int = 0
    """The etcd revision of the last transaction (0 when nothing was written)."""
    transactions: int = 0


class ApplyIncomplete(QuireError):
    """A chunked apply stopped part-way: `applied` were written (by earlier, committed
    transactions), `not_applied` were not (the failed chunk and every later one);
    `unchanged` needed no write. `cause` is what stopped it. Re-running the same
    changes finishes the work."""

    def __init__(self, cause: BaseException, applied: Sequence[str], not_applied: Sequence[str],
                 unchanged: Sequence[str] = (), *, chunk_index: int = 0, chunks: int = 0,
                 revision: int = 0, what: str = "spec") -> None:
        self.cause = cause
        self.applied = tuple(applied)
        self.not_applied = tuple(not_applied)
        self.unchanged = tuple(unchanged)
        self.chunk_index = chunk_index
        self.chunks = chunks
        self.revision = revision
        self.what = what
        total = len(self.applied) + len(self.not_applied)
        super().__init__(
            f"applied {len(self.applied)} of {total} {what} changes "
            f"({chunk_index} of {chunks} transactions), {len(self.not_applied)} not applied: "
            f"transaction {chunk_index + 1} failed: {' '.join(str(cause).split())}; "
            f"re-run the same file to finish")

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_rebuild, (self.cause, self.applied, self.not_applied, self.unchanged,
                           self.chunk_index, self.chunks, self.revision, self.what))

    @property
    def status(self) -> Any:
        """The status of what stopped it (so exit codes follow the cause)."""
        return getattr(self.cause, "status", None)


def _rebuild(cause: BaseException, applied: tuple[str, ...], not_applied: tuple[str, ...],
             unchanged: tuple[str, ...], chunk_index: int, chunks: int, revision: int,
             what: str) -> ApplyIncomplete:
    return ApplyIncomplete(cause, applied, not_applied, unchanged, chunk_index=chunk_index,
                           chunks=chunks, revision=revision, what=what)


def check_limits(max_ops: int, max_bytes: int) -> None:
    if max_ops < 1:
        raise ValidationError("max_txn_size", f"{max_ops} (at least 1 change per transaction)")
    if max_bytes < 1:
        raise ValidationError("max_txn_bytes", f"{max_bytes} (at least 1 byte)")


def plan(edits: Iterable[Edit], current: Mapping[str, tuple[Any, int]]) -> Plan:
    """What to write, given `current` = {name: (stored value, mod revision)}; a stored
    value that could not be read is given as None-valued with its revision (it differs
    from every spec, so it is replaced, guarded by that revision)."""
    pending: list[Edit] = []
    unchanged: list[str] = []
    for edit in edits:
        seen = current.get(edit.name)
        if edit.is_delete:
            if seen is None:
                unchanged.append(edit.name)
                continue
        elif seen is not None and seen[0] is not None and seen[0] == edit.value:
            unchanged.append(edit.name)
            continue
        if edit.expect == -1:
            edit = Edit(edit.name, edit.value, seen[1] if seen is not None else 0, edit.size,
                        edit.item)
        pending.append(edit)
    return Plan(tuple(pending), tuple(unchanged))


def chunk(edits: Sequence[Edit], max_ops: int = MAX_TXN_OPS,
          max_bytes: int = MAX_TXN_BYTES) -> list[list[Edit]]:
    """Consecutive runs of at most `max_ops` edits whose keys and values stay within
    `max_bytes` (an edit larger than that alone is a chunk of its own: etcd then says
    whether it fits)."""
    check_limits(max_ops, max_bytes)
    out: list[list[Edit]] = []
    current: list[Edit] = []
    size = 0
    for edit in edits:
        cost = edit.size + 2 * len(edit.name) + _OP_OVERHEAD
        if current and (len(current) >= max_ops or size + cost > max_bytes):
            out.append(current)
            current, size = [], 0
        current.append(edit)
        size += cost
    if current:
        out.append(current)
    return out


async def run_chunks(chunks: Sequence[Sequence[Edit]], write: Callable[[Sequence[Edit]], Awaitable[int]],
                     *, unchanged: Sequence[str] = (), what: str = "spec",
                     progress: Callable[[int, ApplyResult], Awaitable[None] | None] | None = None,
                     ) -> ApplyResult:
    """Write each chunk in turn with `write` (one transaction; returns its revision).
    `progress(index, result so far)` is called after each chunk is committed. When the
    whole apply is one chunk, its failure is raised as it is (nothing was written);
    otherwise the first failure raises ApplyIncomplete from it."""
    applied: list[str] = []
    revision = 0
    for i, part in enumerate(chunks):
        try:
            revision = await write(part)
        except Exception as exc:
            if len(chunks) == 1:
                raise
            not_applied = [e.name for p in chunks[i:] for e in p]
            raise ApplyIncomplete(exc, applied, not_applied, unchanged, chunk_index=i,
                                  chunks=len(chunks), revision=revision, what=what) from exc
        applied.extend(e.name for e in part)
        if progress is not None:
            done = progress(i, ApplyResult(tuple(applied), tuple(unchanged), revision, i + 1))
            if done is not None:
                await done
    return ApplyResult(tuple(applied), tuple(unchanged), revision, len(chunks))
