"""The checker on synthetic histories: a clean run, then one history per anomaly."""

from __future__ import annotations

import hashlib
import random

import pytest

from chaos.checker import SAFETY_KEYS, JournalReadback, StoredFragment, check, recovery_times
from chaos.history import FaultRecord, History, Op, make_record, parse_records

J = "chaos/j-000"


class Builder:
    """Appends records to an in-memory journal and a history, like a writer would."""

    def __init__(self, seed: int = 1) -> None:
        self.rng = random.Random(seed)
        self.history = History()
        self.journal = bytearray()
        self.seq = 0

    def append(self, outcome: str = "ok", *, land: bool = True, size: int = 120) -> tuple[Op, bytes]:
        self.seq += 1
        uid, data = make_record(0, self.seq, size, self.rng)
        op = self.history.invoke(uid, 0, self.seq, J, len(data))
        begin = len(self.journal)
        if land:
            self.journal += data
        if outcome == "ok":
            self.history.complete(op, "ok", begin=begin, end=begin + len(data))
        else:
            self.history.complete(op, outcome, error="synthetic")
        return op, data

    def readback(self, **kw: object) -> JournalReadback:
        return JournalReadback(J, bytes(self.journal), **kw)  # type: ignore[arg-type]

    def fragment(self, begin: int, end: int, *, data: bytes | None = None,
                 sum_: str | None = None) -> StoredFragment:
        content = bytes(self.journal[begin:end]) if data is None else data
        return StoredFragment(f"{J}/{begin:016x}-{end:016x}.raw", J, begin, end,
                              sum_ or hashlib.sha1(content).hexdigest(), content)


def _only(report_counts: dict[str, int], key: str) -> None:
    others = {k: report_counts[k] for k in SAFETY_KEYS if k != key}
    assert report_counts[key] > 0, report_counts
    assert not any(others.values()), others


def test_records_round_trip_and_detect_corruption() -> None:
    rng = random.Random(3)
    blobs = [make_record(2, i, size, rng)[1] for i, size in enumerate((10, 100, 1000))]
    records, garbage = parse_records(b"".join(blobs), base=50)
    assert [r.seq for r in records] == [0, 1, 2] and garbage == []
    assert records[1].offset == 50 + len(blobs[0])
    assert len(blobs[2]) == 1000
    flipped = bytearray(blobs[1])
    flipped[-5] ^= 1
    records, garbage = parse_records(blobs[0] + bytes(flipped) + blobs[2])
    assert [r.seq for r in records] == [0, 2]
    assert garbage == [(len(blobs[0]), len(blobs[0]) + len(flipped))]
    _, garbage = parse_records(blobs[0][:-1])
    assert garbage == [(0, len(blobs[0]) - 1)]  # torn record, no newline


def test_clean_history_is_safe() -> None:
    b = Builder()
    for _ in range(20):
        b.append()
    b.append("fail", land=False)
    b.append("info", land=True)
    b.append("info", land=False)
    rb = b.readback(views={"replica:a": [(0, bytes(b.journal))]},
                    fragments=[b.fragment(0, 500), b.fragment(500, len(b.journal))])
    report = check([rb], b.history.ops)
    assert report.safe, report.examples
    assert report.appends["acknowledged"] == 20
    assert report.appends["definite_failures"] == 1
    assert report.appends["indefinite_failures"] == 2
    assert report.counts["indefinite_visible"] == 1
    assert report.counts["indefinite_absent"] == 1
    assert report.counts["fragments_checked"] == 2


def test_lost_write() -> None:
    b = Builder()
    b.append()
    b.append(land=False)  # acked but never in the journal
    _only(check([b.readback()], b.history.ops).counts, "lost")


def test_acked_at_wrong_offset_is_lost() -> None:
    b = Builder()
    op1, _ = b.append()
    op2, _ = b.append()
    op1.begin, op1.end, op2.begin, op2.end = op2.begin, op2.end, op1.begin, op1.end
    report = check([b.readback()], b.history.ops)
    assert report.counts["lost"] == 2
    assert "found at" in report.examples["lost"][0]


def test_journal_never_read_back_counts_acked_as_lost() -> None:
    b = Builder()
    b.append()
    b.append()
    assert check([], b.history.ops).counts["lost"] == 2


def test_duplicate() -> None:
    b = Builder()
    _, data = b.append()
    b.append()
    b.journal += data  # the same record lands a second time
    _only(check([b.readback()], b.history.ops).counts, "duplicates")


def test_indefinite_record_may_appear_once_but_not_twice() -> None:
    # An indefinite failure (COMMIT_UNKNOWN, a lost answer after the commit) may be in
    # the journal 0 or 1 times; writers never re-send after a commit, so twice is a
    # duplicate whatever the outcome.
    b = Builder()
    b.append()
    _, data = b.append("info", land=True)
    report = check([b.readback()], b.history.ops)
    assert report.safe and report.counts["indefinite_visible"] == 1
    b.journal += data
    report = check([b.readback()], b.history.ops)
    _only(report.counts, "duplicates")
    assert report.counts["duplicates"] == 1


def test_offsets_written_twice() -> None:
    b = Builder()
    op1, _ = b.append()
    op2, _ = b.append()
    # Two acks claiming the same range: the second ack's record is also elsewhere.
    op2.begin, op2.end = op1.begin, op1.begin + op2.size
    counts = check([b.readback()], b.history.ops).counts
    assert counts["written_twice"] == 1
    assert counts["lost"] == 1  # and the second one is not where its ack says


def test_definite_failure_visible() -> None:
    b = Builder()
    b.append()
    b.append("fail", land=True)  # said "not committed", but it is there
    _only(check([b.readback()], b.history.ops).counts, "uncommitted_visible")


def test_garbage_bytes_visible() -> None:
    b = Builder()
    b.append()
    b.journal += b"\x00\x01torn"
    report = check([b.readback()], b.history.ops)
    _only(report.counts, "uncommitted_visible")
    assert report.counts["garbage_bytes"] == 6


def test_unknown_record_visible() -> None:
    b = Builder()
    b.append()
    b.journal += make_record(9, 9, 100, random.Random(9))[1]
    _only(check([b.readback()], b.history.ops).counts, "uncommitted_visible")


def test_replica_divergence() -> None:
    b = Builder()
    for _ in range(5):
        b.append()
    other = bytearray(b.journal)
    other[200] ^= 0x20
    rb = b.readback(views={"replica:b": [(100, bytes(other[100:400]))]})
    report = check([rb], b.history.ops)
    _only(report.counts, "divergence")
    assert "offset 200" in report.examples["divergence"][0]


def test_replica_ahead_of_final_head() -> None:
    b = Builder()
    b.append()
    extra = make_record(0, 99, 100, random.Random(5))[1]
    rb = b.readback(views={"replica:c": [(0, bytes(b.journal) + extra)]})
    _only(check([rb], b.history.ops).counts, "divergence")


def test_fragment_with_wrong_sum() -> None:
    b = Builder()
    b.append()
    frag = b.fragment(0, len(b.journal), sum_="0" * 40)
    _only(check([b.readback(fragments=[frag])], b.history.ops).counts, "bad_fragments")


def test_fragment_with_wrong_length() -> None:
    b = Builder()
    b.append()
    b.append()
    frag = b.fragment(0, len(b.journal), data=bytes(b.journal[:50]))
    _only(check([b.readback(fragments=[frag])], b.history.ops).counts, "bad_fragments")


def test_unreadable_fragment() -> None:
    b = Builder()
    b.append()
    frag = StoredFragment("k", J, 0, 10, "0" * 40, None, "decode failed")
    _only(check([b.readback(fragments=[frag])], b.history.ops).counts, "bad_fragments")


def test_fragment_content_differs_from_journal() -> None:
    b = Builder()
    b.append()
    b.append()
    n = len(b.journal)
    wrong = bytes(b.journal[:n - 3]) + b"xyz"
    frag = b.fragment(0, n, data=wrong)  # consistent name, inconsistent content
    _only(check([b.readback(fragments=[frag])], b.history.ops).counts, "divergence")


def test_recovery_times_after_primary_kill() -> None:
    ops = [Op("a", 0, 1, J, 10, t_invoke=1.0, t_done=1.1, outcome="ok"),
           Op("b", 0, 2, J, 10, t_invoke=5.5, t_done=9.0, outcome="ok"),
           Op("c", 0, 3, J, 10, t_invoke=6.0, t_done=8.0, outcome="ok"),
           Op("d", 0, 4, J, 10, t_invoke=5.1, t_done=5.2, outcome="info")]
    faults = [FaultRecord("kill-primary", at=5.0, journal=J),
              FaultRecord("kill-primary", at=20.0, journal=J),  # never recovered
              FaultRecord("etcd-restart", at=7.0)]
    assert recovery_times(faults, ops) == [pytest.approx(3.0)]
    report = check([], ops, faults)
    assert report.recovery == {"kills": 2, "recovered": 1, "p50": 3.0, "max": 3.0}
    assert report.faults == {"kill-primary": 2, "etcd-restart": 1}


def test_history_writes_jsonl(tmp_path) -> None:  # type: ignore[no-untyped-def]
    h = History(tmp_path / "h.jsonl")
    op = h.invoke("u1", 0, 1, J, 10)
    h.complete(op, "info", error="timeout")
    h.fault(FaultRecord("net-peer", at=1.0, params={"mode": "slice"}))
    h.close()
    types = [e["type"] for e in History.load(tmp_path / "h.jsonl")]
    assert types == ["invoke", "info", "fault"]
    with pytest.raises(ValueError):
        h.complete(op, "maybe")


def test_stale_head_is_reported_not_unsafe() -> None:
    b = Builder()
    b.append()
    op, _ = b.append()
    report = check([b.readback(head_seen=op.begin)], b.history.ops)
    assert report.safe
    assert report.counts["stale_heads"] == 1


def test_reader_saw_bytes_that_were_not_committed() -> None:
    b = Builder()
    b.append()
    seen = bytes(b.journal) + make_record(0, 50, 100, random.Random(2))[1]
    report = check([b.readback(views={"reader": [(0, seen)]})], b.history.ops)
    _only(report.counts, "uncommitted_visible")
    assert "reader" in report.examples["uncommitted_visible"][0]


def test_reader_saw_other_bytes_than_committed() -> None:
    b = Builder()
    b.append()
    b.append()
    seen = bytearray(b.journal)
    seen[10] ^= 1
    report = check([b.readback(views={"reader": [(0, bytes(seen))]})], b.history.ops)
    _only(report.counts, "uncommitted_visible")


def test_unavailable_after_heal_is_liveness_not_safety() -> None:
    b = Builder()
    b.append()
    report = check([b.readback(unavailable="barrier: TimeoutError")], b.history.ops)
    assert report.safe and report.counts["unavailable_after_heal"] == 1


def test_failed_final_read_is_reconstructed_from_replicas_and_store() -> None:
    b = Builder()
    for _ in range(6):
        b.append()
    full = bytes(b.journal)
    cut = len(full) // 3
    frag = b.fragment(cut, 2 * cut)
    rb = JournalReadback(J, full[:100], read_error="InsufficientJournalBrokers",
                         views={"replica:x": [(0, full[:cut + 5]), (2 * cut - 10, full[2 * cut - 10:])],
                                "reader": [(0, full + b"junk")]},
                         fragments=[frag])
    report = check([rb], b.history.ops)
    assert report.counts["reconstructed"] == 1
    assert report.counts["lost"] == 0
    assert rb.final == full
    # ...but the reader's extra bytes are still caught, and nothing is invented.
    assert report.counts["uncommitted_visible"] == 1


def test_failed_final_read_without_copies_is_lost() -> None:
    b = Builder()
    b.append()
    b.append()
    rb = JournalReadback(J, b"", read_error="InsufficientJournalBrokers")
    report = check([rb], b.history.ops)
    assert report.counts["lost"] == 2 and report.counts["reconstructed"] == 0


def test_hole_over_an_indefinite_append_is_reported_not_unsafe() -> None:
    """A pipeline sync rolled forward past an indefinite append's bytes that no member
    kept: the final read jumps over them (readback fills the hole with newlines)."""
    b = Builder()
    b.append()
    lo = len(b.journal)
    _, data = b.append("info")  # its commit went out; nobody kept the bytes
    hi = len(b.journal)
    b.journal[lo:hi] = b"\n" * (hi - lo)
    b.append()
    report = check([b.readback(holes=[(lo, hi)])], b.history.ops)
    assert report.safe, report.counts
    assert report.counts["holes"] == 1 and report.counts["indefinite_absent"] == 1


def test_acked_append_inside_a_hole_is_lost() -> None:
    b = Builder()
    b.append()
    lo = len(b.journal)
    b.append()
    hi = len(b.journal)
    b.journal[lo:hi] = b"\n" * (hi - lo)
    report = check([b.readback(holes=[(lo, hi)])], b.history.ops)
    _only(report.counts, "lost")
