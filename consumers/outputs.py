"""Exactly-once shard outputs: the output ledger (pure; runner.py sends what it says).

A shard is an exactly-once producer (docs/exactly-once.md, "Consumer shards"):

* **producer name**: stable, from the shard id (`shards/<id>`; a hash of the id when it
  does not fit a producer token), so every primary of the shard, on any host, is the
  same producer;
* **generation**: kept in the shard's store — the **ledger**, one internal key committed
  with every checkpoint, so it moves with the shard through its recovery log — not on
  a host's disk; each new primary uses the ledger's generation + 1 once it commits;
* **one local history per (shard, output journal)**, its txn numbers in the ledger;
* **intents**: the last transaction's outputs (journal, generation, history, txn,
  bytes), written in the same write batch as the state and read offsets.

The commit: the batch (state + offsets + ledger) is appended to the recovery log and
applied to RocksDB; *then* each output journal's bytes of the transaction are appended
as one identified append, and the commit waits for them before the next one — so at
any moment only the last committed transaction's outputs may be missing.

A new primary, after restoring the store, **re-sends the ledger's intents under the
generation they were recorded with** (the old primary's): the broker answers those that
landed with their original commit and writes those that did not — the same
transactions, recognised as such. Only then does it take its own generation, and its
first output to a journal retires the old generation's histories there, so a zombie's
late outputs are refused (PRODUCER_GENERATION_RETIRED). A zombie cannot commit (the
recovery log is fenced) and sends outputs only after a commit, so nothing it could
still send is missing from the ledger the successor re-sent. Why re-send before
bumping: under the new generation the broker could not recognise the re-sent outputs
(a newer generation's history is unknown to it) and would write them again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import msgspec

from protocol.errors import ValidationError
from protocol.producers import validate_identity
from quire.client import TxnId

from .store import Op

__all__ = ["LEDGER_KEY", "Intent", "Ledger", "OutputLedger", "ledger_of", "producer_name"]

LEDGER_KEY = b"\x00q/eo/ledger"


class Intent(msgspec.Struct, frozen=True, array_like=True):
    """One output append of a committed transaction."""

    journal: str
    generation: int
    history: int
    txn: int
    data: bytes

    def txn_id(self, producer: str) -> TxnId:
        return TxnId(producer, self.generation, self.history, self.txn)


class Ledger(msgspec.Struct, array_like=True):
    generation: int = 0
    """The generation of the primary that committed last (0: none yet)."""
    histories: dict[str, tuple[int, int]] = {}
    """output journal -> (history id, last txn)."""
    intents: list[Intent] = []
    """The outputs of the last committed transaction."""


_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder(Ledger)


def ledger_of(ops: Iterable[Op]) -> Ledger | None:
    """The ledger a write batch commits (None: the batch has none)."""
    for k, v in ops:
        if k == LEDGER_KEY and v is not None:
            return _dec.decode(v)
    return None


def producer_name(shard_id: str) -> str:
    """The shard's stable producer name (a token of <= 128 bytes)."""
    name = f"shards/{shard_id}"
    try:
        validate_identity(name, 1, 0, 1)
        return name
    except ValidationError:
        return "shards/" + hashlib.sha1(shard_id.encode()).hexdigest()


class OutputLedger:
    """The shard's exactly-once output state (pure: the store is read once, by the caller)."""

    def __init__(self, producer: str, stored: bytes | None) -> None:
        self.producer = producer
        self.ledger = _dec.decode(stored) if stored else Ledger()
        self.generation = 0
        """This primary's generation: set by start()."""

    def start(self) -> list[Intent]:
        """Take over: the intents to re-send first (under their own, older generation);
        this primary's generation is the ledger's + 1 from now on."""
        self.generation = self.ledger.generation + 1
        validate_identity(self.producer, self.generation, 0, 1)
        return list(self.ledger.intents)

    def commit(self, outputs: Iterable[tuple[str, bytes]]) -> tuple[Op, list[Intent]]:
        """The ledger op for this transaction's write batch, and its intents: one per
        output journal (its messages concatenated, in publish order), next txn each."""
        if not self.generation:
            raise RuntimeError("OutputLedger.commit before start")
        by_journal: dict[str, list[bytes]] = {}
        for journal, data in outputs:
            by_journal.setdefault(journal, []).append(data)
        histories = dict(self.ledger.histories)
        intents = []
        for journal, parts in by_journal.items():
            h, last = histories.get(journal, (0, 0))
            if not h:
                h = 1 + max((hh for hh, _ in histories.values()), default=0)
            histories[journal] = (h, last + 1)
            intents.append(Intent(journal, self.generation, h, last + 1, b"".join(parts)))
        ledger = Ledger(self.generation, histories, intents)
        return (LEDGER_KEY, _enc.encode(ledger)), intents

    def committed(self, op: Op) -> None:
        """The batch holding `op` is durable: it is the ledger now."""
        assert op[1] is not None
        self.ledger = _dec.decode(op[1])
