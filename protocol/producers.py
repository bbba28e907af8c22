"""Transition identifiers of exactly-once appends (docs/exactly-once.md).

The datastore seed's four-level identifier ("Identifying state transitions"), carried
as optional fields of an AppendRequest:

    producer    the member name: a stable token naming the writer (1..128 bytes)
    generation  the frontend generation: a locally persisted counter, incremented once
                per start of the producer (unsigned 64-bit, >= 1)
    history     the local history: one per stream of appends (e.g. per journal, or per
                (shard, output journal)); 0 = none (free-standing transactions)
    txn         the transaction number, monotonic within the history (>= 1)

An append without a producer carries none of them and behaves exactly as before.

`ProducerMark` is what the primary records for the last transaction of a history it
acted on (with that transaction's own commit: begin/end offsets and SHA-1); it rides
on the commit proposal so every replica keeps the same table. `ProducerSnapshot` is a
whole table: it rides on pipeline synchronizations (and the sync answers of replicas
that are ahead) and on the write head a graceful exit records.
"""

from __future__ import annotations

import msgspec

from .errors import ValidationError
from .names import TOKEN_SYMBOLS, validate_token

__all__ = ["PRODUCER_MAX", "U64_MAX", "ProducerMark", "ProducerSnapshot", "validate_identity"]

U64_MAX = (1 << 64) - 1
PRODUCER_MIN, PRODUCER_MAX = 1, 128


class ProducerMark(msgspec.Struct, frozen=True, array_like=True):
    """The last transaction acted on for one (producer, generation, history).

    Array-like on the wire: it travels with every identified commit proposal.
    """

    producer: str
    generation: int
    history: int
    txn: int
    begin: int
    """The transaction's own commit: [begin, end) with SHA-1 `sum`."""
    end: int
    sum: str
    at: int
    """The primary's wall clock (unix seconds) when it committed: replicas expire idle
    producers by it, so every replica prunes the same entries."""
    closed: bool = False
    """The history was closed by this transaction: a tombstone."""


class ProducerSnapshot(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A whole producer table (journal-scoped), oldest activity first."""

    generations: tuple[tuple[str, int, int], ...] = ()
    """(producer, newest generation seen, at) — an older generation is retired."""
    marks: tuple[ProducerMark, ...] = ()


def validate_identity(producer: str, generation: int, history: int, txn: int,
                      close_history: bool = False) -> None:
    """The identifier fields of an AppendRequest (raises ValidationError naming the field)."""
    if not producer:
        for name, value in (("generation", generation), ("history", history), ("txn", txn)):
            if value:
                raise ValidationError(name, f"{name} {value} without a producer")
        if close_history:
            raise ValidationError("close_history", "closing a history needs a producer")
        return
    validate_token(producer, "producer", PRODUCER_MIN, PRODUCER_MAX, TOKEN_SYMBOLS)
    for name, value, low in (("generation", generation, 1), ("history", history, 0),
                             ("txn", txn, 1)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValidationError(name, f"expected an integer, got {type(value).__name__}")
        if not (low <= value <= U64_MAX):
            raise ValidationError(name, f"{value} is out of range (expected {low} <= {name} "
                                        f"<= 2**64-1)")
    if close_history and history == 0:
        raise ValidationError("close_history", "history 0 (none) cannot be closed")
