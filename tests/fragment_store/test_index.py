from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fragment_store import CoverSet, decode_index, encode_index, merge
from protocol import Fragment, ValidationError

J = "a/journal"


def f(begin: int, end: int, store: str = "", mod: int = 0) -> Fragment:
    s = hashlib.sha1(f"{begin}-{end}".encode()).hexdigest() if end > begin else "0" * 40
    return Fragment(journal=J, begin=begin, end=end, sum=s, backing_store=store, mod_time=mod)


def spans(cs: CoverSet) -> list[tuple[int, int]]:
    return [(x.begin, x.end) for x in cs]


def test_add_semantics() -> None:
    cs = CoverSet()
    assert cs.add(f(0, 10)) and cs.add(f(10, 20)) and cs.add(f(20, 30))
    assert not cs.add(f(5, 5))          # empty: ignored
    assert not cs.add(f(0, 10))         # equal span: the entry present wins
    assert not cs.add(f(12, 18))        # covered
    assert cs.add(f(5, 15))             # overlaps both neighbours, covers neither
    assert spans(cs) == [(0, 10), (5, 15), (10, 20), (20, 30)]
    assert cs.add(f(5, 30))             # covers three entries
    assert spans(cs) == [(0, 10), (5, 30)]
    assert cs.add(f(0, 30))
    assert spans(cs) == [(0, 30)]
    assert cs.end_offset == 30 and cs.begin_offset == 0
    assert CoverSet().end_offset == 0


def test_lookup_prefers_the_longest_tail() -> None:
    cs = CoverSet([f(0, 10), f(5, 15), f(10, 20), f(30, 40)])
    assert cs.lookup(0) == f(0, 10)
    assert cs.lookup(4) == f(0, 10)
    assert cs.lookup(5) == f(5, 15)     # both cover 5; [5, 15) has more after it
    assert cs.lookup(9) == f(5, 15)
    assert cs.lookup(10) == f(10, 20)
    assert cs.lookup(19) == f(10, 20)
    assert cs.lookup(20) is None and cs.find(20) == (3, False)
    assert cs.next_after(20) == f(30, 40)
    assert cs.lookup(40) is None and cs.find(40) == (4, False)
    assert cs.next_after(40) is None
    assert cs.gaps() == [(20, 30)]


def test_merge_drops_locals_covered_by_remote() -> None:
    remote = [f(0, 100, "s3://b/"), f(100, 150, "s3://b/")]
    local = [f(0, 100), f(40, 60), f(140, 200), f(200, 210)]
    cs = merge(remote, local)
    assert [(x.begin, x.end, x.backing_store) for x in cs] == [
        (0, 100, "s3://b/"), (100, 150, "s3://b/"), (140, 200, ""), (200, 210, "")]


def test_select_by_mod_time() -> None:
    cs = CoverSet([f(0, 1, "s", 100), f(1, 2, "s", 200), f(2, 3)])
    assert spans(CoverSet(cs.select(150))) == [(1, 2), (2, 3)]
    assert spans(CoverSet(cs.select(0, 150))) == [(0, 1)]
    assert spans(CoverSet(cs.select())) == [(0, 1), (1, 2), (2, 3)]


def test_json_round_trip_and_validation() -> None:
    cs = CoverSet([f(0, 10, "s3://b/", 5), f(10, 20)])
    data = encode_index(cs)
    assert data.startswith(b"[{")
    assert decode_index(data) == cs
    assert decode_index(data.decode(), J) == cs
    with pytest.raises(ValidationError):
        decode_index(data, "other/journal")
    for bad in (b"{}", b"[{\"journal\": 3}]", b"not json", b'[{"journal":"a/journal","sum":"zz"}]'):
        with pytest.raises(ValidationError):
            decode_index(bad)


# -- properties -------------------------------------------------------------------------

span_lists = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 25)), max_size=25).map(
    lambda xs: [f(b, b + n) for b, n in xs])


def is_covered(x: Fragment, by: Fragment) -> bool:
    return by.begin <= x.begin and x.end <= by.end


@given(span_lists, st.randoms(use_true_random=False))
@settings(max_examples=400, deadline=None)
def test_insertion_order_does_not_matter(frags: list[Fragment], rnd) -> None:  # type: ignore[no-untyped-def]
    shuffled = list(frags)
    rnd.shuffle(shuffled)
    assert spans(CoverSet(frags)) == spans(CoverSet(shuffled))


@given(span_lists)
@settings(max_examples=400, deadline=None)
def test_invariants(frags: list[Fragment]) -> None:
    cs = CoverSet(frags)
    items = list(cs)
    # Ordered by begin and end, nothing covered by another, nothing empty.
    assert all(a.begin < b.begin and a.end < b.end for a, b in zip(items, items[1:]))
    assert all(x.end > x.begin for x in items)
    # Every non-empty input is in the set or covered by a member.
    for x in frags:
        if x.end > x.begin:
            assert any(is_covered(x, y) for y in items)
    # Members come from the input.
    assert all(x in frags for x in items)


@given(span_lists, st.integers(0, 100))
@settings(max_examples=400, deadline=None)
def test_lookup_is_the_covering_fragment_with_maximal_end(frags: list[Fragment], offset: int) -> None:
    cs = CoverSet(frags)
    covering = [x for x in frags if x.begin <= offset < x.end]
    got = cs.lookup(offset)
    if not covering:
        assert got is None  # no gap is invented
    else:
        assert got is not None and got.begin <= offset < got.end
        assert got.end == max(x.end for x in covering)
    # end_offset is the furthest byte any input reaches.
    assert cs.end_offset == max((x.end for x in frags if x.end > x.begin), default=0)


@given(span_lists, span_lists)
@settings(max_examples=200, deadline=None)
def test_merge_keeps_every_remote_fragment_not_covered_by_another_remote(
        remote: list[Fragment], local: list[Fragment]) -> None:
    remote = [Fragment(journal=x.journal, begin=x.begin, end=x.end, sum=x.sum, backing_store="s3://b/")
              for x in remote]
    cs = merge(remote, local)
    for x in CoverSet(remote):
        # A remote fragment disappears only behind a strictly larger local one.
        assert x in list(cs) or any(is_covered(x, y) and (y.begin, y.end) != (x.begin, x.end)
                                    for y in cs)
    for y in cs:
        if not y.backing_store:
            assert not any(is_covered(y, x) for x in remote)
