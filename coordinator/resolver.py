"""Resolver: a journal's spec, route and primary as of the local KeySpace (resolver.go).

Every RPC starts here. A request carrying a later etcd revision (a peer's header, or a
client's min_etcd_revision) first waits for the KeySpace to reach it, boundedly: a peer
that is ahead must not make us answer from an older topology.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from protocol import Etcd, Header, JournalSpec, ProcessId, Route, Status

from topology.assignments import route_of, with_endpoints
from topology.keyspace import Assignment, KeySpace

__all__ = ["Resolution", "Resolver"]

DEFAULT_REVISION_WAIT = 10.0


@dataclass(frozen=True)
class Resolution:
    status: Status
    header: Header
    spec: JournalSpec | None = None
    route: Route = Route()
    assignments: list[Assignment] = field(default_factory=list)
    is_primary: bool = False
    is_member: bool = False
    current: bool = True
    """This member can vouch for its view (Resolver.may_lead): False while its lease is
    unconfirmed or its keyspace is older than its standing (topology/membership.py)."""

    @property
    def primary_endpoint(self) -> str | None:
        return self.route.primary_endpoint

    @property
    def revision(self) -> int:
        return self.header.etcd.revision


class Resolver:
    def __init__(self, keyspace: KeySpace, me: ProcessId | None,
                 *, revision_wait: float = DEFAULT_REVISION_WAIT) -> None:
        self.keyspace = keyspace
        self.me = me
        self.revision_wait = revision_wait
        self.may_lead: Callable[[], bool] = lambda: True
        """False while our view cannot be vouched for (Membership's standing, and the
        keyspace caught up with it): we then resolve as if our journals had no primary,
        so appends here fail with NO_JOURNAL_PRIMARY_BROKER (the client retries
        elsewhere), our pipelines' fences refuse to acknowledge, and no write head is
        told from here (read_api.py)."""
        self._memo: tuple[dict[str, Resolution], dict[str, Resolution]] = ({}, {})
        """resolve_now's answers (require_primary False, True) at `_memo_at`."""
        self._memo_at: tuple[int, bool] = (-1, False)
        """(keyspace revision, may_lead()) the memo holds answers for."""

    async def resolve(self, journal: str, *, min_revision: int = 0,
                      require_primary: bool = False) -> Resolution:
        ks = self.keyspace
        if min_revision > ks.revision:
            if not await ks.wait_for_revision(min_revision, self.revision_wait):
                return Resolution(Status.UNAVAILABLE, self._header(Route()))
        return self.resolve_now(journal, require_primary=require_primary)

    def resolve_now(self, journal: str, *, require_primary: bool = False) -> Resolution:
        """Resolve against the mirror as it is (no waiting).

        A resolution is a function of the mirror at one revision and of `may_lead()`, so
        it is kept until either changes: the coordinator's own periodic readers (the
        backlog, its route gaps, the persister's "am I primary", 2 of each per hosted
        journal every 5 s: ~12,000 a tick at 6,000 replicas) and repeated appends share
        one answer per journal and revision instead of a route built anew each time."""
        ks = self.keyspace
        at = (ks.revision, self.may_lead())
        memo = self._memo[require_primary]
        if at != self._memo_at:
            self._memo = ({}, {})
            self._memo_at = at
            memo = self._memo[require_primary]
        else:
            res = memo.get(journal)
            if res is not None:
                return res
        res = self._resolve(ks, journal, require_primary, at[1])
        if res.status != Status.JOURNAL_NOT_FOUND:  # (a name not in the mirror: not kept)
            memo[journal] = res
        return res

    def _resolve(self, ks: KeySpace, journal: str, require_primary: bool,
                 lead: bool) -> Resolution:
        entry = ks.journals.get(journal)
        if entry is None:
            return Resolution(Status.JOURNAL_NOT_FOUND, self._header(Route()))
        assignments = ks.assignments(journal)
        endpoints = {pid: m.spec.endpoint for pid, m in ks.members.items()}
        route = with_endpoints(route_of(assignments), endpoints)
        header = self._header(route)
        is_member = self.me is not None and route.index_of(self.me) >= 0
        is_primary = self.me is not None and route.primary_id == self.me
        current = not is_member or lead
        if is_primary and not current:
            # Stepped down until etcd confirms our lease again: no primary here.
            route = msgspec.structs.replace(route, primary=-1)
            header = self._header(route)
            is_primary = False
        if not route.members:
            status = Status.INSUFFICIENT_JOURNAL_BROKERS
        elif require_primary and route.primary < 0:
            status = Status.NO_JOURNAL_PRIMARY_BROKER
        else:
            status = Status.OK
        return Resolution(status, header, entry.spec, route, assignments, is_primary, is_member,
                          current)

    def _header(self, route: Route) -> Header:
        etcd = self.keyspace.etcd
        return Header(process_id=self.me, route=route,
                      etcd=Etcd(cluster_id=etcd.cluster_id, member_id=etcd.member_id,
                                revision=self.keyspace.revision, raft_term=etcd.raft_term))
