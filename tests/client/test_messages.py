"""JSON-lines framing and rendezvous mapping."""

from __future__ import annotations

import collections

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quire.client import Client, FramingError, LineFramer, Mapper, NoJournals, encode, rendezvous
from quire.client.messages import encode_many, read_messages

from .fakebroker import running


def test_encode_is_one_line_per_message() -> None:
    assert encode({"a": "x\ny"}) == b'{"a":"x\\ny"}\n'
    assert encode_many([1, [2]]) == b"1\n[2]\n"


def test_framer_carries_a_partial_tail_across_reads() -> None:
    framer = LineFramer()
    assert framer.feed(100, b'{"a":1}\n{"b"') == [(100, b'{"a":1}\n')]
    assert framer.pending == 4 and framer.next_offset == 108
    assert framer.feed(112, b':2}\n') == [(108, b'{"b":2}\n')]
    assert framer.pending == 0 and framer.next_offset == 116
    assert framer.feed_json(116, b'[1]\n\n"s"\n') == [(116, [1]), (121, "s")]


def test_framer_drops_a_tail_that_an_offset_jump_cut_off() -> None:
    framer = LineFramer()
    framer.feed(0, b'{"lost"')
    assert framer.feed(1000, b'1\n') == [(1000, b"1\n")]
    assert framer.dropped == 7


def test_framer_bounds_a_message_without_newline() -> None:
    framer = LineFramer(max_message=10)
    with pytest.raises(FramingError):
        framer.feed(0, b"x" * 11)
    with pytest.raises(FramingError):
        LineFramer().feed_json(0, b"{not json}\n")


@given(st.lists(st.dictionaries(st.text(max_size=5), st.integers()), max_size=20),
       st.lists(st.integers(min_value=1, max_value=9), min_size=1))
def test_framer_yields_exactly_the_messages_whatever_the_chunking(msgs, cuts) -> None:
    data = encode_many(msgs)
    framer = LineFramer()
    out, pos, i = [], 0, 0
    while pos < len(data):
        n = cuts[i % len(cuts)]
        out.extend(framer.feed_json(pos, data[pos:pos + n]))
        pos, i = pos + n, i + 1
    assert [m for _, m in out] == msgs
    # Each reported offset is where that message starts.
    offsets = [o for o, _ in out]
    expected, at = [], 0
    for m in msgs:
        expected.append(at)
        at += len(encode(m))
    assert offsets == expected


def test_rendezvous_is_stable_and_moves_few_keys() -> None:
    parts = [f"clicks/part-{i:03d}" for i in range(8)]
    keys = [f"user-{i}" for i in range(2000)]
    before = {k: rendezvous(k, parts) for k in keys}
    assert before == {k: rendezvous(k, list(reversed(parts))) for k in keys}
    counts = collections.Counter(before.values())
    assert len(counts) == 8 and min(counts.values()) > 2000 / 8 / 2
    after = {k: rendezvous(k, parts + ["clicks/part-008"]) for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    # Only keys that now prefer the new partition move (about 1/9 of them).
    assert all(after[k] == "clicks/part-008" for k in moved)
    assert 0 < len(moved) < 2000 / 9 * 1.5
    with pytest.raises(LookupError):
        rendezvous("k", [])


async def test_mapper_selects_topic_partitions_and_refreshes() -> None:
    async with running() as broker:
        for i in range(3):
            broker.create(f"clicks/part-{i:03d}", topic="clicks")
        broker.create("views/part-000", topic="views")
        async with Client([broker.endpoint]) as client:
            mapper = Mapper("topic=clicks", client, refresh_interval=0)
            chosen = {await mapper.map(f"k{i}") for i in range(100)}
            assert chosen == {f"clicks/part-{i:03d}" for i in range(3)}
            broker.create("clicks/part-003", topic="clicks")
            chosen = {await mapper.map(f"k{i}") for i in range(200)}
            assert "clicks/part-003" in chosen
            with pytest.raises(NoJournals):
                await Mapper("topic=none", client).map("k")


async def test_read_messages_over_a_reader() -> None:
    async with running() as broker:
        broker.create("msgs/journal")
        async with Client([broker.endpoint]) as client:
            await client.append("msgs/journal", encode_many([{"n": i} for i in range(5)]))
            got = [m async for m in read_messages(client.read("msgs/journal"))]
            assert [m["n"] for _, m in got] == list(range(5))
            assert got[1][0] == len(encode({"n": 0}))
