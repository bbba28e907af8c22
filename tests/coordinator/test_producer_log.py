"""The marks log (coordinator/producer_log.py): a crash at any byte replays to a table
the journal really had, never claims a transaction past the last seal, and stays
bounded by compaction."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.producer_log import (
    LOG_FILE,
    LoggedProducerTable,
    Marked,
    encode_record,
    replay,
)
from coordinator.producers import ProducerTable
from protocol import ProducerMark, ProducerSnapshot

J = "eo/log"


def _replayed(data: bytes, limit: int, floor: int = 0) -> tuple[ProducerSnapshot, int]:
    t = ProducerTable(J, limit=limit)
    r = replay(data, t, floor)
    return t.snapshot(), r.sealed


ops = st.lists(st.one_of(
    st.tuples(st.just("mark"), st.sampled_from("abc"), st.integers(1, 3), st.integers(0, 3),
              st.integers(1, 300)),
    st.tuples(st.just("seal")),
    st.tuples(st.just("drop"), st.integers(0, 400)),
    st.tuples(st.just("restore"), st.integers(0, 5)),
), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops=ops, limit=st.integers(2, 6), compact=st.sampled_from([64, 200, 1 << 20]),
       flush=st.sampled_from([1, 3, 256]), cut=st.data())
def test_any_truncation_replays_to_the_table_at_a_seal(ops, limit, compact, flush, cut) -> None:  # noqa: ANN001
    """The oracle: a log cut at any byte (after its last rewrite, which is renamed into
    place whole) replays to the live table exactly as it was at the last seal whose
    record the cut keeps — never a mark of the open spool, never a history forgotten
    that the seal knew."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / LOG_FILE
        live = LoggedProducerTable.open(J, path, None, limit=limit, compact_bytes=compact,
                                        flush_records=flush)
        end, txns, at = 0, {}, 0
        # (log bytes at the seal, the table then): the seals of the current file.
        seals: list[tuple[bytes, ProducerSnapshot]] = [(b"", ProducerSnapshot())]
        for op in ops:
            base_before = live.log.base, live.log.size
            if op[0] == "mark":
                _, p, g, h, size = op
                key = (p, g, h)
                txns[key] = txns.get(key, 0) + 1
                at += 1
                live.apply(ProducerMark(p, g, h, txns[key], end, end + size, "s", at))
                end += size
            elif op[0] == "seal":
                if end <= live.sealed_end:
                    continue
                live.flush()  # the file's seal flushes first (DiskFiles.before_seal)
                live.sealed(end)
            elif op[0] == "drop":
                end = min(end, max(op[1], live.sealed_end))  # sealed bytes never drop
                live.drop_after(end)
            else:
                # a roll forward to a peer's table: the live one minus its newest marks
                snap = live.snapshot()
                live.restore(ProducerSnapshot(generations=snap.generations,
                                              marks=snap.marks[:op[1]]))
            data = path.read_bytes() if path.exists() else b""
            if (live.log.base, live.log.size) != base_before and live.log.size == live.log.base:
                seals = [(data, live.snapshot() if data else ProducerSnapshot())]  # rewritten
            elif op[0] == "seal":
                seals.append((data, live.snapshot()))
            # The whole log, and any cut of it, replays to the table at its last seal.
            for k in (len(data), cut.draw(st.integers(live.log.base, len(data)), label="cut")):
                t = ProducerTable(J, limit=limit)
                r = replay(data[:k], t)
                at_seal = [snap for v, snap in seals if data[:k].startswith(v)]
                assert at_seal and t.snapshot() == at_seal[-1], (k, len(data), op)
                assert all(m.end <= r.sealed for m in t.snapshot().marks)
        assert live.log.size <= max(compact, 2 * live.log.base) + 90 * len(ops) + 64
        live.close()


def test_torn_tail_is_ignored_and_reopen_continues(tmp_path: Path) -> None:
    path = tmp_path / LOG_FILE
    live = LoggedProducerTable.open(J, path, None)
    for t in (1, 2):
        live.apply(ProducerMark("w", 1, 1, t, (t - 1) * 10, t * 10, "s", t))
    live.sealed(20)  # a roll: txns 1 and 2 are in a sealed fragment
    live.apply(ProducerMark("w", 1, 1, 3, 20, 30, "s", 3))  # in the open spool
    live.close()
    data = path.read_bytes()
    torn = data + encode_record(Marked(ProducerMark("w", 1, 1, 4, 30, 40, "s", 4)))[:-3]
    again = LoggedProducerTable.open(J, path, torn)
    assert again.sealed_end == 20
    assert again.get("w", 1, 1).txn == 2  # txn 3 never survived: it is new again
    assert again.check("w", 1, 1, 2).original is not None
    assert again.check("w", 1, 1, 3).new
    # The reopened log was rewritten whole, so records after it are read too.
    again.apply(ProducerMark("w", 1, 1, 3, 20, 35, "s", 5))
    again.sealed(35)
    again.close()
    got, sealed = _replayed(path.read_bytes(), again.limit)
    assert sealed == 35 and [m.txn for m in got.marks] == [3]


def test_a_sealed_file_on_disk_keeps_marks_the_log_had_not_sealed(tmp_path: Path) -> None:
    path = tmp_path / LOG_FILE
    live = LoggedProducerTable.open(J, path, None)
    live.apply(ProducerMark("w", 1, 1, 1, 0, 10, "s", 1))
    live.close()  # killed between the file's seal and the Sealed record
    data = path.read_bytes()
    assert LoggedProducerTable.open(J, tmp_path / "x", data).get("w", 1, 1) is None
    kept = LoggedProducerTable.open(J, path, data, sealed_floor=10)
    assert kept.get("w", 1, 1).txn == 1


def test_journals_without_producers_keep_no_file(tmp_path: Path) -> None:
    path = tmp_path / LOG_FILE
    path.write_bytes(b"stale")
    table = LoggedProducerTable.open(J, path, None)  # assigned afresh: stale log goes
    assert not path.exists()
    table.sealed(100)
    table.restore(ProducerSnapshot())
    assert not path.exists()
    table.apply(ProducerMark("w", 1, 1, 1, 100, 110, "s", 1))
    assert not path.exists()  # buffered until a seal (or FLUSH_RECORDS)
    table.flush()
    got, sealed = _replayed(path.read_bytes(), table.limit)
    assert sealed == 100 and got.marks == ()  # 110 is past the last seal
    table.sealed(110)
    got, _ = _replayed(path.read_bytes(), table.limit)
    assert [m.txn for m in got.marks] == [1]
