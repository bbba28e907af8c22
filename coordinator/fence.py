"""Fencing a superseded primary: why a paused-then-woken primary can no longer acknowledge.

The seed argues that "a synchronized pipeline held by an FSM is a distributed and
exclusive lock over the capability to append to a journal": every replica grants its
spool to one replicate stream at a time, and a new primary must synchronize with every
member before it appends. Like every etcd-lease lock (Jepsen, etcd 3.4.3) that lock
gives no mutual exclusion by itself: a primary SIGSTOPped past its lease TTL is removed
from the route by the allocator, but when it wakes it still holds its replicate streams
(the replicas' spools) and a keyspace that has not caught up, and it would happily
acknowledge appends it finds in its socket buffers. We fence it by route + revision:

1. *Peers are the fence.* A replica checks, before applying each proposal of a
   replicate stream, whether its own keyspace changed after the stream's header
   revision (`StreamFence.valid`); if it did and the journal's route is no longer
   equivalent to the stream's route, it answers WRONG_ROUTE and ends the stream (which
   rolls back uncommitted bytes and releases the spool). Independently, every keyspace
   change makes the coordinator abort the replicate streams whose route is superseded
   (`abort_superseded`, from hosting), so the spool is released at once rather than
   when the stale primary or a timeout gets around to it. A stream whose header is
   older than the replica's current route is refused at its start (replicate_api).
2. *An ack needs every peer.* The primary acknowledges an append only after every peer
   of its route acknowledged the commit (pipeline.py). The new route is written at
   some revision R (the stale primary's assignments vanish with its lease). Take any
   replica X in both the old and the new route. Either X applied the stale primary's
   commit before its keyspace reached R — then the commit is in X's spool, X keeps it
   (a spool is never dropped while it holds unpersisted content: hosting/replica), and
   the new primary, which can only synchronize with X after X reached R (its header
   revision is >= R and X waits for it) and after X released the stale stream (the
   fence), sees X's larger offset and rolls forward to it ("largest offset wins"); or X
   reached R first — then it refuses the commit, so the stale primary cannot gather
   every peer's ack and acknowledges nothing. Either way nothing acknowledged is lost,
   and once any peer has seen R the stale primary cannot acknowledge any more appends.
3. *The primary re-checks too* (`PrimaryFence`, consulted by the pipeline's
   acknowledgement reader before it resolves a commit's ticket): if its own keyspace
   already shows a newer route in which it is not the primary, it fails the append.
   This is only an early exit — right after SIGCONT its keyspace may still be stale —
   the correctness argument is (1) + (2).
4. A coordinator whose lease expired while it was paused is no longer a member at all:
   hosting drops every pipeline at once and re-registers with a new lease (hosting.py).
"""

from __future__ import annotations

from typing import Any

from protocol import Route


class StreamFence:
    """A replicate stream's route check at the replica (cheap while the keyspace is still)."""

    __slots__ = ("journal", "route", "revision", "_resolver", "_checked")

    def __init__(self, resolver: Any, journal: str, route: Route, revision: int) -> None:
        self.journal = journal
        self.route = route
        self.revision = revision
        self._resolver = resolver
        self._checked = revision

    def valid(self) -> bool:
        changed = self._resolver.keyspace.changed_revision
        return changed <= self._checked or _recheck(self, changed, primary=False)


class PrimaryFence:
    """The primary's own check before acknowledging: is this still our route?"""

    __slots__ = ("journal", "route", "_resolver", "_checked")

    def __init__(self, resolver: Any, journal: str, route: Route, revision: int) -> None:
        self.journal = journal
        self.route = route
        self._resolver = resolver
        self._checked = revision

    def __call__(self) -> bool:
        changed = self._resolver.keyspace.changed_revision
        return changed <= self._checked or _recheck(self, changed, primary=True)


def _recheck(fence: StreamFence | PrimaryFence, changed: int, *, primary: bool) -> bool:
    """The keyspace changed since the fence's last check: re-resolve and compare the
    route (and, for the primary's fence, that we still are its primary)."""
    now = fence._resolver.resolve_now(fence.journal)
    if not ((not primary or now.is_primary) and now.route.equivalent(fence.route)):
        return False
    fence._checked = changed
    return True


def abort_superseded(replicas: dict, resolver: Any) -> int:  # noqa: ANN001
    """Abort every replicate stream whose route the keyspace superseded (hosting calls
    this on every keyspace change). Returns how many were aborted."""
    n = 0
    for replica in list(replicas.values()):
        stream = replica.stream
        if stream is None:
            continue
        fence, conn = stream
        if not fence.valid():
            replica.stream = None
            conn.abort()
            n += 1
    return n
