"""Pure micro-batch planning (spark.offsets): offset maps, the byte cap, and the split
of a journal's range into store spans and a coordinator tail."""

from __future__ import annotations

import pytest

from protocol import Codec, Fragment
from spark.offsets import OffsetsError, Tail, cap_offsets, parse_offsets, plan_journal


def frag(begin: int, end: int, journal: str = "jj/a") -> Fragment:
    return Fragment(journal=journal, begin=begin, end=end, sum="0" * 40, codec=Codec.NONE)


def test_parse_offsets() -> None:
    assert parse_offsets("earliest") == "earliest"
    assert parse_offsets(" LATEST ") == "latest"
    assert parse_offsets('{"jj/a": 10, "jj/b": 0}') == {"jj/a": 10, "jj/b": 0}
    for bad in ('{"jj/a": "10"}', '{"jj/a": true}', '{"../x": 1}', "soon", "[]"):
        with pytest.raises(OffsetsError, match="startingOffsets"):
            parse_offsets(bad)


def test_plan_splits_persisted_run_and_tail() -> None:
    frags = [frag(0, 100), frag(100, 250), frag(400, 500)]
    spans, tail = plan_journal("jj/a", frags, 50, 600)
    assert [(s.begin, s.end, s.first) for s in spans] == [(50, 100, True), (100, 250, False)]
    assert spans[-1].stop == 250  # the batch's last message ends at 250, a boundary
    assert tail == Tail("jj/a", 250, 600)  # the hole at 250 and what follows: coordinators
    # A hole at the start: everything from the coordinators.
    assert plan_journal("jj/a", frags, 260, 450) == ([], Tail("jj/a", 260, 450))
    # Fully persisted: no tail. Empty range: nothing.
    assert plan_journal("jj/a", frags, 0, 250)[1] is None
    assert plan_journal("jj/a", frags, 30, 30) == ([], None)
    # Store-only streams plan every run from the store.
    spans, tail = plan_journal("jj/a", frags, 0, 500, tail=False)
    assert tail is None and [s.begin for s in spans] == [0, 100, 400]


def test_cap_offsets_snaps_to_append_boundaries() -> None:
    idx = {"jj/a": [frag(0, 100), frag(100, 200), frag(200, 300)], "jj/b": []}
    heads = {"jj/a": 350, "jj/b": 50}
    # Everything fits.
    assert cap_offsets({}, heads, idx, 1000) == heads
    # 400 pending, cap 200: j/a's share is 175 -> fragment end 100; j/b's share (25)
    # holds no boundary (its tail is read whole) -> it waits.
    assert cap_offsets({}, heads, idx, 200) == {"jj/a": 100, "jj/b": 0}
    # No boundary within any share: the largest backlog advances alone, one boundary
    # (soft cap: progress on every trigger).
    assert cap_offsets({"jj/a": 100, "jj/b": 0}, heads, idx, 10) == {"jj/a": 200, "jj/b": 0}
    assert cap_offsets({"jj/a": 350, "jj/b": 0}, heads, idx, 10) == {"jj/a": 350, "jj/b": 50}
