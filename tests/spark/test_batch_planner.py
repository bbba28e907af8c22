"""The planner is pure: fragments in, spans out. These tests need no store and no JVM."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import Codec, Fragment, ValidationError
from spark.planner import Span, covering_runs, plan

J = "test/journal"


def frag(begin: int, end: int, codec: str = "none", journal: str = J) -> Fragment:
    return Fragment(journal=journal, begin=begin, end=end, sum=f"{begin:020x}{end:020x}",
                    codec=Codec(codec))


def ranges(spans: list[Span]) -> list[tuple[int, int, bool, int]]:
    return [(s.begin, s.end, s.first, s.stop) for s in spans]


def test_one_span_per_fragment_and_ownership_bounds() -> None:
    spans = plan([frag(0, 100), frag(100, 250, "gzip"), frag(250, 300, "zstd")])
    # The first span trusts its begin; inner spans own starts in (begin, end]; the last
    # span's stop is the read's end (a message starting at 300 is outside the read).
    assert ranges(spans) == [(0, 100, True, 101), (100, 250, False, 251), (250, 300, False, 300)]
    assert [len(s.chain) for s in spans] == [3, 2, 1]
    assert all(s.chain_complete for s in spans)


def test_requested_range_clips_and_trusts_begin() -> None:
    spans = plan([frag(0, 100), frag(100, 250), frag(250, 300)], begin=120, end=260)
    assert ranges(spans) == [(120, 250, True, 251), (250, 260, False, 260)]
    # Read-past continues beyond the requested end, to finish the last message.
    assert spans[-1].chain[-1].end == 300


def test_begin_before_first_fragment_starts_at_the_index_begin() -> None:
    spans = plan([frag(500, 600)], begin=0)
    assert ranges(spans) == [(500, 600, True, 600)]


def test_gap_makes_a_new_trusted_run() -> None:
    spans = plan([frag(0, 100), frag(150, 200)])
    assert ranges(spans) == [(0, 100, True, 101), (150, 200, True, 200)]
    assert spans[0].chain == (frag(0, 100),)  # read-past stops at the gap
    assert spans[0].chain_complete


def test_overlapping_fragments_are_trimmed_and_covered_ones_dropped() -> None:
    runs, kept = covering_runs([frag(0, 100), frag(50, 160), frag(60, 90), frag(160, 170)])
    assert [(lo, hi) for lo, hi, _ in runs[0]] == [(0, 100), (100, 160), (160, 170)]
    assert frag(60, 90) not in kept


def test_large_uncompressed_fragments_split_compressed_do_not_by_default() -> None:
    spans = plan([frag(0, 1000), frag(1000, 2000, "gzip")], max_span_bytes=300)
    assert ranges(spans)[:4] == [(0, 250, True, 251), (250, 500, False, 501),
                                 (500, 750, False, 751), (750, 1000, False, 1001)]
    assert ranges(spans)[4:] == [(1000, 2000, False, 2000)]
    split = plan([frag(0, 1000, "gzip")], max_span_bytes=500, split_compressed=True)
    assert ranges(split) == [(0, 500, True, 501), (500, 1000, False, 1000)]
    assert all(s.fragment == frag(0, 1000, "gzip") for s in split)


def test_small_fragments_coalesce_up_to_min_span_bytes() -> None:
    frags = [frag(i * 10, i * 10 + 10) for i in range(10)]
    spans = plan(frags, min_span_bytes=35)
    assert [(s.begin, s.end) for s in spans] == [(0, 30), (30, 60), (60, 90), (90, 100)]
    assert [s.first for s in spans] == [True, False, False, False]


def test_read_past_is_bounded() -> None:
    frags = [frag(i, i + 1) for i in range(100)]
    span = plan(frags, read_past_fragments=3)[0]
    assert len(span.chain) == 4 and not span.chain_complete


@pytest.mark.parametrize("kwargs, option", [
    ({"begin": -1}, "begin"), ({"begin": 5, "end": 4}, "end"),
    ({"max_span_bytes": 0}, "maxSpanBytes"), ({"read_past_fragments": -1}, "readPastFragments"),
])
def test_bad_arguments_name_the_option(kwargs: dict, option: str) -> None:
    with pytest.raises(ValidationError) as info:
        plan([frag(0, 10)], **kwargs)
    assert info.value.path == option


def test_one_journal_per_plan() -> None:
    with pytest.raises(ValidationError):
        plan([frag(0, 10), frag(10, 20, journal="test/other")])


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(1, 999), max_size=30), gaps=st.sets(st.integers(0, 30)),
       begin=st.integers(0, 1000), length=st.integers(0, 1000),
       max_span=st.integers(1, 400), min_span=st.integers(0, 300))
def test_spans_tile_the_read_and_stops_partition_message_starts(
        cuts: list[int], gaps: set[int], begin: int, length: int,
        max_span: int, min_span: int) -> None:
    bounds = [0, *sorted(set(cuts)), 1000]
    frags = [frag(a, b) for i, (a, b) in enumerate(zip(bounds, bounds[1:])) if i not in gaps]
    end = begin + length
    spans = plan(frags, begin=begin, end=end, max_span_bytes=max_span, min_span_bytes=min_span)
    covered = [(f.begin, f.end) for f in frags]
    want = sorted(o for a, b in covered for o in range(max(a, begin), min(b, end)))
    got = sorted(o for s in spans for o in range(s.begin, s.end))
    assert got == want  # spans tile exactly the readable bytes of [begin, end)
    # Every offset that could start a message is owned by exactly one span:
    # [begin, stop) for first spans, (begin, stop) otherwise.
    for o in want:
        owners = [s for s in spans if (s.begin <= o if s.first else s.begin < o) and o < s.stop]
        assert len(owners) == 1, (o, owners)
    for s in spans:
        assert s.chain[0].begin <= s.begin < s.chain[0].end
