"""The producer table (coordinator/producers.py): unit cases and hypothesis properties.

The model: a journal that writes a transaction only when the table says it is new, and
records the mark. Whatever order of sends, re-sends, skips, generations and closes the
producers try, no transaction is ever written twice, a re-send is answered with the
original commit, and the table stays within its bounds.
"""

from __future__ import annotations

import hashlib

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.producers import ProducerTable
from protocol import AppendRequest, Fragment, ProducerMark, ProducerSnapshot, ReplicateProposal, Status
from protocol.producers import U64_MAX, validate_identity
from protocol.errors import (
    HistoryClosed,
    ProducerGenerationRetired,
    TxnOutOfOrder,
    TxnSuperseded,
    ValidationError,
    for_status,
)
from protocol.wire import encode_frame

import pytest

J = "eo/journal"


class Journal:
    """The table's user: writes only what check() calls new."""

    def __init__(self, **kw) -> None:  # noqa: ANN003
        self.table = ProducerTable(J, **kw)
        self.end = 0
        self.written: list[tuple[str, int, int, int]] = []
        self.commits: dict[tuple[str, int, int, int], tuple[int, int, str]] = {}

    def send(self, p: str, g: int, h: int, t: int, close: bool = False, at: int = 0):  # noqa: ANN201
        v = self.table.check(p, g, h, t, close)
        if not v.new:
            return v
        data = f"{p}/{g}/{h}/{t}".encode()
        begin, self.end = self.end, self.end + len(data)
        s = hashlib.sha1(data).hexdigest()
        self.written.append((p, g, h, t))
        self.commits[(p, g, h, t)] = (begin, self.end, s)
        self.table.apply(ProducerMark(p, g, h, t, begin, self.end, s, at, close))
        return v


def test_resend_is_answered_with_the_original_commit() -> None:
    j = Journal()
    assert j.send("w", 1, 1, 1).new
    assert j.send("w", 1, 1, 2).new
    v = j.send("w", 1, 1, 2)
    assert v.status == Status.OK and not v.new
    assert (v.original.begin, v.original.end, v.original.sum) == j.commits[("w", 1, 1, 2)]
    assert j.written.count(("w", 1, 1, 2)) == 1


def test_skip_ahead_and_behind_are_refused_with_the_cause() -> None:
    j = Journal()
    for t in (1, 2, 3):
        j.send("w", 1, 1, t)
    ahead = j.send("w", 1, 1, 5)
    assert ahead.status == Status.TXN_OUT_OF_ORDER and "skips ahead" in ahead.message
    assert "next must be 4" in ahead.message
    behind = j.send("w", 1, 1, 2)
    assert behind.status == Status.TXN_SUPERSEDED and "txn 3 was already acted on" in behind.message
    assert j.send("w", 1, 1, 4).new


def test_newer_generation_retires_the_older_one() -> None:
    j = Journal()
    j.send("w", 1, 1, 1)
    j.send("w", 1, 2, 1)
    j.send("other", 1, 1, 1)
    assert j.send("w", 2, 1, 7).new  # a new generation's history may start anywhere
    old = j.send("w", 1, 1, 2)
    assert old.status == Status.PRODUCER_GENERATION_RETIRED and "generation 2" in old.message
    assert j.table.get("w", 1, 2) is None and j.table.get("w", 1, 1) is None
    assert j.table.get("other", 1, 1) is not None  # another producer is untouched


def test_closed_history_is_a_tombstone() -> None:
    j = Journal()
    j.send("w", 1, 3, 1)
    assert j.send("w", 1, 3, 2, close=True).new
    again = j.send("w", 1, 3, 2, close=True)
    assert again.status == Status.OK and again.original is not None  # a re-sent close
    later = j.send("w", 1, 3, 3)
    assert later.status == Status.HISTORY_CLOSED and "closed by txn 2" in later.message


def test_identity_validation() -> None:
    validate_identity("", 0, 0, 0)
    validate_identity("w-1.example/a", 1, 0, 1)
    validate_identity("w", U64_MAX, U64_MAX, U64_MAX)
    bad = [("", 1, 0, 0, False, "generation"), ("w", 0, 0, 1, False, "generation"),
           ("w", 1, 0, 0, False, "txn"), ("w", 1, -1, 1, False, "history"),
           ("w", 1, 0, U64_MAX + 1, False, "txn"), ("w w", 1, 0, 1, False, "producer"),
           ("x" * 129, 1, 0, 1, False, "producer"), ("w", 1, 0, 1, True, "close_history"),
           ("", 0, 0, 0, True, "close_history")]
    for p, g, h, t, c, field in bad:
        with pytest.raises(ValidationError) as e:
            validate_identity(p, g, h, t, c)
        assert e.value.path == field
    v = ProducerTable(J).check("w", 0, 0, 1)
    assert v.status == Status.BAD_REQUEST and "generation" in v.message


def test_status_errors_name_the_cause() -> None:
    assert for_status(Status.TXN_OUT_OF_ORDER) is TxnOutOfOrder
    assert for_status(Status.TXN_SUPERSEDED) is TxnSuperseded
    assert for_status(Status.PRODUCER_GENERATION_RETIRED) is ProducerGenerationRetired
    assert for_status(Status.HISTORY_CLOSED) is HistoryClosed
    e = HistoryClosed("history 3 was closed by txn 2", journal=J)
    assert str(e) == f"HISTORY_CLOSED (journal {J}): history 3 was closed by txn 2"
    assert all(20 <= s < 30 for s in (Status.TXN_OUT_OF_ORDER, Status.TXN_SUPERSEDED,
                                       Status.PRODUCER_GENERATION_RETIRED, Status.HISTORY_CLOSED))


def test_plain_messages_are_unchanged_on_the_wire() -> None:
    """A plain append carries no identifier field (omit_defaults): only the journal. Its
    map header is msgpack's map16 (3 bytes, not fixmap's 1) since AppendRequest has 16
    fields (`roll_below`, the jobs scheduler's roll): msgspec sizes the header by the
    fields a struct can have."""
    plain = msgspec.msgpack.encode(AppendRequest(journal=J))
    assert msgspec.msgpack.decode(plain) == {"journal": J}
    assert len(plain) <= len(msgspec.msgpack.encode({"journal": J})) + 2
    req = AppendRequest(journal=J, producer="w", generation=U64_MAX, history=2, txn=3)
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(req), type=AppendRequest)
    assert back == req
    mark = ProducerMark("w", 1, 2, 3, 0, 10, "a" * 40, 5)
    prop = ReplicateProposal(proposal=Fragment(journal=J, begin=0, end=10), mark=mark)
    back = decode_frame_bytes(encode_frame(prop))
    assert back.mark == mark
    assert b"mark" not in b"".join(encode_frame(ReplicateProposal(proposal=prop.proposal)))


def decode_frame_bytes(bufs) -> ReplicateProposal:  # noqa: ANN001
    raw = b"".join(bytes(b) for b in bufs)
    return msgspec.msgpack.decode(raw[9:], type=ReplicateProposal)


def test_expiry_and_limit_bound_the_table() -> None:
    j = Journal(limit=3, expiry=100)
    for h in range(1, 6):
        j.send("w", 1, h, 1, at=h)
    assert len(j.table) == 3 and j.table.get("w", 1, 1) is None  # LRU evicted first
    j.send("w", 1, 5, 2, at=1000)  # the others are idle for > 100 s now
    assert len(j.table) == 1 and j.table.get("w", 1, 5).txn == 2
    # An expired history is unknown: any txn is new again (documented loss of dedup).
    assert j.send("w", 1, 3, 9, at=1001).new


def test_drop_after_forgets_dropped_commits() -> None:
    j = Journal()
    j.send("a", 1, 1, 1)
    cut = j.end
    j.send("b", 1, 1, 1)
    assert j.table.drop_after(cut) == 1
    assert j.table.get("b", 1, 1) is None and j.table.get("a", 1, 1) is not None


# -- properties ---------------------------------------------------------------------

ops = st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(1, 3), st.integers(0, 2),
                         st.integers(1, 6), st.integers(0, 7).map(lambda x: x == 0)),
               max_size=120)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_no_transaction_is_ever_written_twice(seq) -> None:  # noqa: ANN001
    j = Journal()
    newest: dict[str, int] = {}
    closed: dict[tuple[str, int, int], int] = {}
    for i, (p, g, h, t, close) in enumerate(seq):
        close = close and h != 0
        v = j.send(p, g, h, t, close, at=i)
        key = (p, g, h)
        if g < newest.get(p, 0):
            assert v.status == Status.PRODUCER_GENERATION_RETIRED
        elif key in closed and t != closed[key]:
            assert v.status in (Status.HISTORY_CLOSED,) or (t < closed[key] and
                                                            v.status == Status.TXN_SUPERSEDED)
        if v.original is not None:
            assert (v.original.begin, v.original.end, v.original.sum) == j.commits[(p, g, h, t)]
        if v.new:
            newest[p] = max(newest.get(p, 0), g)
            if close:
                closed[key] = t
    # Exactly once: no (producer, generation, history, txn) appears twice.
    assert len(j.written) == len(set(j.written))
    # Within a history (one generation) written txns go up by exactly one after the first.
    by_key: dict[tuple[str, int, int], list[int]] = {}
    for p, g, h, t in j.written:
        by_key.setdefault((p, g, h), []).append(t)
    for txns in by_key.values():
        assert all(b == a + 1 for a, b in zip(txns, txns[1:]))


@settings(max_examples=200, deadline=None)
@given(ops, st.integers(1, 6))
def test_snapshot_restore_gives_the_same_verdicts_and_stays_bounded(seq, limit) -> None:  # noqa: ANN001
    j = Journal(limit=limit)
    for i, (p, g, h, t, close) in enumerate(seq):
        j.send(p, g, h, t, close and h != 0, at=i)
        assert len(j.table) <= limit
    snap = msgspec.msgpack.decode(msgspec.msgpack.encode(j.table.snapshot()), type=ProducerSnapshot)
    copy = ProducerTable(J, limit=limit)
    copy.restore(snap)
    for p in "ab":
        for g in range(1, 4):
            for h in range(3):
                for t in range(1, 8):
                    assert copy.check(p, g, h, t) == j.table.check(p, g, h, t)
