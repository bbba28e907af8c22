"""The pure parts: placement, member steps, lifecycle transitions, commit policy, records."""

from __future__ import annotations

import pytest

from consumers.plan import (Action, CommitPolicy, Lifecycle, Step, other_primaries, placement,
                            plan_member)
from consumers.recoverylog import Record, RecordReader, encode_record
from protocol import ProcessId
from protocol.shard import ShardSource, ShardSpec, ShardState, ShardStatus
from topology.allocator_plan import MemberState

A, B, C = ProcessId("za", "mem-a"), ProcessId("zb", "mem-b"), ProcessId("za", "mem-c")


def spec(i: int, standbys: int = 0, disable: bool = False) -> ShardSpec:
    return ShardSpec(id=f"s-{i:02d}", sources=(ShardSource(journal=f"src/p-{i:02d}"),),
                     hot_standbys=standbys, disable=disable)


def test_placement_one_primary_per_shard_balanced_and_zone_spread() -> None:
    specs = [spec(i, standbys=1) for i in range(8)]
    ranked = placement(specs, [MemberState(m, 100) for m in (A, B, C)])
    assert set(ranked) == {s.id for s in specs}
    for members in ranked.values():
        assert len(members) == 2 and members[0] != members[1]
        assert members[0].zone != members[1].zone  # standby in the other zone
    loads = [sum(1 for m in ranked.values() if m[0] == x) for x in (A, B, C)]
    assert max(loads) - min(loads) <= 2 and sum(loads) == 8


def test_placement_skips_disabled_and_exiting() -> None:
    ranked = placement([spec(1), spec(2, disable=True)], [MemberState(A, 10, exiting=True),
                                                          MemberState(B, 10)])
    assert ranked == {"s-01": [B]}


def test_plan_member_steps() -> None:
    specs = {s.id: s for s in (spec(1, 1), spec(2), spec(3))}
    ranked = {"s-01": [A, B], "s-02": [B], "s-03": [A]}
    # A: acquire s-01 (free), not s-03 (locked by B: wait for B to release it).
    steps = plan_member(A, specs, ranked, {"s-03": str(B)}, primaries=[], standbys=[])
    assert steps == [Step(Action.ACQUIRE, "s-01")]
    # B: release s-03 (not desired), stand by for s-01, acquire s-02.
    steps = plan_member(B, specs, ranked, {"s-03": str(B)}, primaries=["s-03"], standbys=[])
    assert set(steps) == {Step(Action.RELEASE, "s-03"), Step(Action.STANDBY, "s-01"),
                          Step(Action.ACQUIRE, "s-02")}
    # A standby that becomes the desired primary keeps tailing until it acquires.
    steps = plan_member(B, specs, {"s-01": [B]}, {}, primaries=[], standbys=["s-01"])
    assert steps == [Step(Action.ACQUIRE, "s-01")]
    # Deleted shard: release.
    assert plan_member(A, {}, {}, {"s-09": str(A)}, ["s-09"], []) == [Step(Action.RELEASE, "s-09")]


def test_lifecycle_transitions() -> None:
    lc = Lifecycle()
    for state in (ShardState.BACKFILL, ShardState.STANDBY, ShardState.BACKFILL, ShardState.PRIMARY,
                  ShardState.IDLE):
        lc.to(state)
    with pytest.raises(ValueError):
        lc.to(ShardState.PRIMARY)
    lc.to(ShardState.FAILED, "boom")
    assert lc.reason == "boom"
    lc.to(ShardState.IDLE)


def test_commit_policy() -> None:
    p = CommitPolicy(interval=1.0)
    assert not p.due(10.0, 0) and p.wait_budget(10.0) == 1.0
    p.on_message(10.0)
    assert not p.due(10.5, 5) and p.wait_budget(10.5) == 0.5
    assert p.due(10.5, 5, idle=True) and p.due(11.0, 5)
    p.committed()
    p.notice = True
    assert p.due(12.0, 0) and p.wait_budget(12.0) == 0.0


def test_record_reader_splits_and_joins_chunks() -> None:
    recs = [Record(author="a", ops=[(b"k", b"v"), (b"d", None)]), Record(author="b", fence=True)]
    data = b"".join(encode_record(r) for r in recs)
    reader = RecordReader(100)
    out = reader.feed(100, data[:7]) + reader.feed(107, data[7:])
    assert [r for r, _ in out] == recs
    assert out[-1][1] == 100 + len(data) == reader.offset
    with pytest.raises(ValueError):
        reader.feed(5, b"x")


def test_other_primaries_are_other_members_primary_reports_of_the_shard() -> None:
    me = ProcessId("a", "me")

    def r(shard: str, member: str, state: ShardState) -> ShardStatus:
        return ShardStatus(id=shard, member=member, state=state)

    reports = [r("s", "a#me", ShardState.PRIMARY), r("s", "b#old", ShardState.PRIMARY),
               r("s", "c#sb", ShardState.STANDBY), r("t", "d#x", ShardState.PRIMARY),
               r("s", "e#f", ShardState.FAILED)]
    assert other_primaries(me, "s", reports) == ["b#old"]
    assert other_primaries(me, "t", reports) == ["d#x"]
    assert other_primaries(me, "u", reports) == []
