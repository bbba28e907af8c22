"""Exactly-once identifiers on the client side: the seed's frontend (docs/exactly-once.md).

    producer = Producer.start("billing-7", state_dir)   # generation += 1, persisted
    history = producer.history()                         # 1, 2, ... per generation
    await client.append("topic/a", b"...", txn=history.next())

`Producer.start` reads the last generation from `<state_dir>/<name>.generation`,
increments it and writes it back (atomically, under an exclusive lock) before any
append of the new incarnation is sent: every start is a new, larger generation, and the
broker retires the histories of older ones when the first append of the new one lands.

`TxnId` is the four-level identifier an identified append carries. Callers that keep
their own counters (a consumer shard committing its next txn with its checkpoint) may
build one directly: `TxnId("shard-3", generation, history, txn)`.

Re-sending is safe only for the same bytes under the same TxnId: the broker does not
compare content, it answers a re-sent txn with the original commit.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass, replace
from pathlib import Path

from protocol.config import default_data_dir
from protocol.producers import U64_MAX, validate_identity

__all__ = ["History", "Producer", "TxnId", "default_state_dir"]


def default_state_dir() -> Path:
    """Where generations are persisted by default: `<data dir>/producers`."""
    return default_data_dir() / "producers"


@dataclass(frozen=True, slots=True)
class TxnId:
    producer: str
    generation: int
    history: int
    txn: int
    close_history: bool = False

    def __post_init__(self) -> None:
        validate_identity(self.producer, self.generation, self.history, self.txn,
                          self.close_history)

    def closing(self) -> TxnId:
        """This transaction also closes its history (a tombstone at the broker)."""
        return replace(self, close_history=True)

    def fields(self) -> dict[str, object]:
        """The AppendRequest fields."""
        return {"producer": self.producer, "generation": self.generation,
                "history": self.history, "txn": self.txn, "close_history": self.close_history}


class History:
    """A local history: transaction numbers from `first`, one per append, in order.

    `next()` allocates; the caller must re-send a transaction until it has an
    authoritative answer before allocating the next one (Client.append does)."""

    def __init__(self, producer: str, generation: int, history: int, first: int = 1) -> None:
        self.producer = producer
        self.generation = generation
        self.id = history
        self.last = first - 1
        TxnId(producer, generation, history, first)  # validates

    def unused(self, txn: TxnId) -> None:
        """The broker definitely did not act on `txn` (a refusal): reuse its number, or
        the next transaction would skip ahead (TXN_OUT_OF_ORDER)."""
        if txn.history == self.id and txn.txn == self.last:
            self.last -= 1

    def next(self) -> TxnId:
        if self.last >= U64_MAX:
            raise OverflowError(f"history {self.id} of {self.producer!r} ran out of txn numbers")
        self.last += 1
        return TxnId(self.producer, self.generation, self.id, self.last)


class Producer:
    """One incarnation (generation) of a named producer."""

    def __init__(self, name: str, generation: int) -> None:
        validate_identity(name, generation, 0, 1)
        self.name = name
        self.generation = generation
        self._histories = 0

    @classmethod
    def start(cls, name: str, state_dir: str | os.PathLike[str] | None = None) -> Producer:
        """A new generation of `name`: the persisted counter incremented once, durably."""
        validate_identity(name, 1, 0, 1)
        root = Path(state_dir) if state_dir is not None else default_state_dir()
        root.mkdir(parents=True, exist_ok=True)
        path = root / (name.replace("/", "%2F") + ".generation")
        lock = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two starts at once still get distinct numbers
            try:
                raw = path.read_text("ascii").strip()
            except FileNotFoundError:
                raw = ""
            try:
                last = int(raw) if raw else 0
            except ValueError:
                raise ValueError(f"{path}: not a generation number: {raw!r}") from None
            generation = last + 1
            if generation > U64_MAX:
                raise OverflowError(f"{path}: generation counter exhausted")
            tmp = path.with_name(path.name + ".tmp")
            with open(tmp, "w", encoding="ascii") as f:
                f.write(f"{generation}\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)  # whole or absent, never torn
            dfd = os.open(root, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        finally:
            os.close(lock)  # releases the lock
        return cls(name, generation)

    def history(self, first_txn: int = 1) -> History:
        """The next local history of this generation (numbered from 1)."""
        self._histories += 1
        return History(self.name, self.generation, self._histories, first_txn)
