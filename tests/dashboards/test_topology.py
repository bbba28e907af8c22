"""dashboards.topology: decoding etcd's keys and naming a journal's replication state."""

from __future__ import annotations

import msgspec

from dashboards.topology import Assignment, consistency, decode, labels_of, route_of
from protocol import JournalSpec, LabelSet, ProcessId, Route

A, C = ProcessId("zone-a", "coord-a1"), ProcessId("zone-b", "coord-b1")


def kv(key: str, value: object) -> tuple[bytes, bytes]:
    raw = value if isinstance(value, bytes) else msgspec.json.encode(value)
    return key.encode(), raw


def route(primary: ProcessId, *members: ProcessId) -> Route:
    ms = tuple(sorted({primary, *members}))
    return Route(members=ms, primary=ms.index(primary))


def test_decode_every_key_kind() -> None:
    spec = JournalSpec(name="a/b/c", replication=2, labels=LabelSet.of(topic="t"))
    adv = route(C, A)
    topo = decode("/q/", [
        kv("/q/journals/a/b/c", spec),
        kv("/q/members/zone-a#coord-a1", {"id": {"zone": "zone-a", "suffix": "coord-a1"}, "endpoint": "h:1",
                                    "journal_limit": 7, "exiting": True,
                                    "health": "failed: spool write failed: EIO"}),
        kv("/q/assign/a/b/c#zone-b#coord-b1#0", adv),
        kv("/q/assign/a/b/c#zone-a#coord-a1#1", b"{}"),
        kv("/q/allocator/leader", b"zone-a#coord-a1"),
        kv("/q/members/zone-a#bad", b"not json"),
        kv("/q/assign/broken", b"{}"),
        kv("/q/unrelated", b"x"),
    ], revision=42)
    assert topo.revision == 42 and topo.journals == {"a/b/c": spec}
    assert topo.members[A].endpoint == "h:1" and topo.members[A].journal_limit == 7
    assert topo.members[A].exiting
    assert topo.members[A].health == "failed: spool write failed: EIO"  # the spool's, shown
    assert topo.leader == A
    assigned = topo.assignments["a/b/c"]
    assert [(a.member, a.slot) for a in assigned] == [(C, 0), (A, 1)]
    assert assigned[0].advertised == adv and assigned[1].advertised is None
    assert sorted(topo.malformed) == ["/q/assign/broken", "/q/members/zone-a#bad"]
    assert labels_of(spec) == {"topic": ["t"]}


def test_journal_names_with_hashes_split_from_the_right() -> None:
    topo = decode("/q", [kv("/q/assign/odd#name#zone-b#coord-b1#2", b"")])
    (a,) = topo.assignments["odd#name"]
    assert (a.member, a.slot, a.advertised) == (C, 2, None)


def test_route_of_sorts_members_and_marks_slot_zero() -> None:
    r = route_of([Assignment("j", C, 0, None), Assignment("j", A, 1, None)])
    assert r.members == (A, C) and r.primary_id == C


def test_consistency_states() -> None:
    good = route(C, A)
    assert consistency([], 2) == "unassigned"
    assert consistency([Assignment("j", A, 1, good)], 2) == "no-primary"
    assert consistency([Assignment("j", C, 0, good), Assignment("j", A, 1, None)], 2) == "pending"
    stale = route(A, C)  # same members, another primary
    assert consistency([Assignment("j", C, 0, good), Assignment("j", A, 1, stale)], 2) == "pending"
    assert consistency([Assignment("j", C, 0, good), Assignment("j", A, 1, good)], 2) == "consistent"
    three = route(C, A)
    assert consistency([Assignment("j", C, 0, three), Assignment("j", A, 1, three)], 3) == "under-replicated"
