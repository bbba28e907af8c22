"""The cluster topology as etcd holds it, decoded from one range read (pure, no IO).

Keys (docs/architecture.md):

    <root>/journals/<journal>                       JournalSpec JSON
    <root>/members/<zone>#<suffix>                  BrokerSpec JSON {id, endpoint, journal_limit, exiting, health}
    <root>/assign/<journal>#<zone>#<suffix>#<slot>  Route JSON advertised by the primary ({} until then)
    <root>/allocator/leader                         <zone>#<suffix>

The dashboard is a layer-4 role and may not import `coordinator/`, so the few lines that
decode these keys are repeated here; the key layout is the documented contract.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from protocol import JournalSpec, ProcessId, Route

__all__ = ["Assignment", "Member", "Topology", "consistency", "decode", "route_of"]


@dataclass(frozen=True, slots=True)
class Member:
    id: ProcessId
    endpoint: str = ""
    journal_limit: int = 0
    exiting: bool = False
    health: str = ""
    """Empty while healthy; else why its spool refuses writes (full / failed: reason)."""


@dataclass(frozen=True, slots=True)
class Assignment:
    journal: str
    member: ProcessId
    slot: int
    advertised: Route | None
    """The route the primary wrote into this assignment; None until it did."""


@dataclass
class Topology:
    revision: int = 0
    journals: dict[str, JournalSpec] = field(default_factory=dict)
    members: dict[ProcessId, Member] = field(default_factory=dict)
    assignments: dict[str, list[Assignment]] = field(default_factory=dict)
    leader: ProcessId | None = None
    malformed: list[str] = field(default_factory=list)
    """Keys under the root whose value could not be decoded."""


class _BrokerSpec(msgspec.Struct, frozen=True, kw_only=True):
    id: ProcessId
    endpoint: str = ""
    journal_limit: int = 1024
    exiting: bool = False
    health: str = ""


def decode(root: str, kvs: Iterable[tuple[bytes, bytes]], revision: int = 0) -> Topology:
    """A Topology from (key, value) pairs read under `root + "/"`."""
    root = root.rstrip("/")
    journals, members, assign = f"{root}/journals/", f"{root}/members/", f"{root}/assign/"
    leader = f"{root}/allocator/leader"
    topo = Topology(revision=revision)
    for raw_key, value in kvs:
        key = raw_key.decode(errors="replace")
        try:
            if key.startswith(journals):
                spec = msgspec.json.decode(value, type=JournalSpec)
                topo.journals[spec.name] = spec
            elif key.startswith(members):
                b = msgspec.json.decode(value, type=_BrokerSpec)
                topo.members[b.id] = Member(b.id, b.endpoint, b.journal_limit, b.exiting, b.health)
            elif key.startswith(assign):
                a = _assignment(key[len(assign):], value)
                topo.assignments.setdefault(a.journal, []).append(a)
            elif key == leader:
                topo.leader = ProcessId.parse(value.decode())
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError, UnicodeDecodeError):
            topo.malformed.append(key)
    for items in topo.assignments.values():
        items.sort(key=lambda a: (a.slot, a.member))
    return topo


def _assignment(rest: str, value: bytes) -> Assignment:
    parts = rest.rsplit("#", 3)
    if len(parts) != 4 or not parts[0] or not parts[3].isdigit():
        raise ValueError(f"bad assignment key {rest!r}")
    journal, zone, suffix, slot = parts
    route = msgspec.json.decode(value, type=Route) if value.strip() else None
    return Assignment(journal, ProcessId(zone, suffix), int(slot),
                      route if route is not None and route.members else None)


def route_of(assignments: Iterable[Assignment]) -> Route:
    """Members sorted by (zone, suffix); the slot-0 assignee is primary."""
    items = list(assignments)
    members = tuple(sorted({a.member for a in items}))
    primaries = sorted(a.member for a in items if a.slot == 0)
    return Route(members=members, primary=members.index(primaries[0]) if primaries else -1)


def consistency(assignments: list[Assignment], replication: int) -> str:
    """One word for the journal's replication state, worst first:

    `unassigned` (no replica), `no-primary`, `pending` (some replica has not yet been
    told the current route by the primary — a pipeline sync is due), `under-replicated`
    (consistent but fewer replicas than the spec asks for), `consistent`.
    """
    if not assignments:
        return "unassigned"
    route = route_of(assignments)
    if route.primary < 0:
        return "no-primary"
    if not all(a.advertised is not None and a.advertised.equivalent(route) for a in assignments):
        return "pending"
    if len(route.members) < replication:
        return "under-replicated"
    return "consistent"


def labels_of(spec: JournalSpec) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for label in spec.labels.labels:
        out.setdefault(label.name, []).append(label.value)
    return out


def as_builtins(obj: Any) -> Any:
    return msgspec.to_builtins(obj)
