"""Pure parts of the two fail-to-safety rules (the real-cluster tests are
tests/workers/test_fail_to_safety.py and tests/workers/test_replaced_tail.py)."""

from __future__ import annotations

from coordinator.append_rules import index_ahead_message
from coordinator.replica import Replica
from coordinator.retired_check import first_difference
from coordinator.spool import MemoryFiles
from protocol import ProcessId, Route


def test_the_refusal_names_the_journal_the_route_the_offset_and_the_command() -> None:
    route = Route(members=(ProcessId("a", "fresh-0"), ProcessId("b", "fresh-1")), primary=0)
    words = index_ahead_message("x/y", 0, 2400, route)
    assert words.startswith("journal x/y: no member of its route (a#fresh-0, b#fresh-1) "
                            "ever held it"), words
    assert "up to offset 2400" in words and "`quire journals reset-head -j x/y`" in words
    behind = index_ahead_message("x/y", 1200, 2400)
    assert "holds it past offset 1200" in behind and "ever held" not in behind


def test_first_difference_is_the_first_offset_whose_byte_differs() -> None:
    ours = b"0123456789"  # a fragment [100, 110)
    assert first_difference(ours, 100, 100, b"0123") is None
    assert first_difference(ours, 100, 104, b"4567890000") is None  # theirs goes on
    assert first_difference(ours, 100, 103, b"3X5") == 104
    assert first_difference(ours, 100, 100, b"X") == 100


def test_a_dropped_stale_fragment_is_gone_and_bounds_the_remembered_head() -> None:
    replica = Replica("x/y", MemoryFiles())
    spool = replica.spool
    spool.apply_content(0, b"agreed tail a later epoch replaced")
    spool.apply_proposal(spool.commit_proposal(), epoch=3)  # a replica adopts (publishes)
    assert replica.retire()  # closed for persistence: something only we may hold
    assert replica.retired
    closed = replica.local[0].fragment
    assert replica.drop_stale(closed, 7)
    assert replica.local == [] and replica.stale_from == 7 and replica.head == 7
    assert not replica.drop_stale(closed, 7)  # (already gone)
