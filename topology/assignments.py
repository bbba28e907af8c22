"""Routes built from assignments, and the primary's advertisement of consistency.

After a pipeline sync the primary writes the synced route into every assignment of the
journal (the seed's stateUpdateAssignments). An assignment whose value equals the route
built from all current assignments is *consistent*; the allocator removes replicas only
from a journal whose assignments are all consistent.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import aetcd
import msgspec
import structlog

from protocol import ProcessId, Route

from .etcd import AssignmentConflict, EtcdError, assignment_key, cmp_mod, put_op, txn
from .keyspace import Assignment, KeySpace

__all__ = ["advertise_route", "is_consistent", "route_of", "with_endpoints"]

log = structlog.get_logger()


def route_of(assignments: Iterable[Assignment]) -> Route:
    """The route of a journal's assignments: members sorted by (zone, suffix), slot 0 primary."""
    items = list(assignments)
    members = tuple(sorted({a.member for a in items}))
    primaries = sorted(a.member for a in items if a.slot == 0)
    primary = members.index(primaries[0]) if primaries else -1
    return Route(members=members, primary=primary)


def with_endpoints(route: Route, endpoints: dict[ProcessId, str]) -> Route:
    """The route with each member's endpoint attached ("" for a member not announced)."""
    return Route(members=route.members, primary=route.primary,
                 endpoints=tuple(endpoints.get(m, "") for m in route.members))


def is_consistent(assignments: Sequence[Assignment]) -> bool:
    """Every assignment advertises the route built from all of them (and there is one)."""
    if not assignments:
        return False
    route = route_of(assignments)
    return all(a.value is not None and a.value.equivalent(route) for a in assignments)


async def advertise_route(client: aetcd.Client, keyspace: KeySpace, journal: str,
                          route: Route) -> int:
    """Write `route` into every assignment of `journal` unless all already hold it.

    Returns the etcd revision of the write, or 0 when nothing needed writing. Raises
    AssignmentConflict when the assignments changed since `keyspace` saw them or when
    `route` is not the route of the current assignments (the caller's view is stale and
    it must re-resolve, as the seed's FSM does).
    """
    assignments = keyspace.assignments(journal)
    target = route.without_endpoints()
    if not assignments or not route_of(assignments).equivalent(target):
        raise AssignmentConflict(f"route {target} is not the current route of the assignments",
                                 journal=journal)
    if is_consistent(assignments):
        return 0
    value = msgspec.json.encode(target)
    compares = [cmp_mod(_key(keyspace, a), a.mod_revision) for a in assignments]
    # Same lease as the existing key: the value changes, its lifetime must not.
    puts = [put_op(_key(keyspace, a), value, a.lease) for a in assignments]
    try:
        result = await txn(client, compares, puts)
    except EtcdError as exc:
        if "lease not found" in str(exc):
            raise AssignmentConflict("an assignee's lease expired", journal=journal) from exc
        raise
    if not result.succeeded:
        raise AssignmentConflict(f"assignments changed before revision {result.revision}",
                                 journal=journal)
    log.info("route advertised", journal=journal, route=str(target), revision=result.revision)
    return result.revision


def _key(keyspace: KeySpace, a: Assignment) -> str:
    return assignment_key(keyspace.root, a.journal, a.member, a.slot)
