"""A model-based property test of the replication sync protocol (pure, no IO).

N members, each a real `Replica` (coordinator/replica.py: a real `Spool` over
MemoryFiles plus what the replicate path does around it — publication of commits,
`replicate_api.take_spool` when another stream takes the spool, closed fragments kept until
persisted and dropped when a sync cuts a stale tail), driven by the same proposals the
coordinator sends:

* `new_route` — the etcd revision moves on, a route of 1..3 members with a primary is
  resolved; the old pipeline's streams end (peers roll back uncommitted content), and
  the new primary runs a whole pipeline sync (sync_driver.run_sync, as append_sync.py);
* `resync` — a broken pipeline is rebuilt under the same route (the header revision
  moves on or not: it is the keyspace revision at resolution, not the route's);
* `append` — content to the primary then every peer, a commit proposal (the primary's
  own spool first, as Pipeline.send_proposal); every member adopted it: acknowledged,
  the primary publishes it, and the model records the bytes at their offsets;
* `append_fails` — content reaches every peer, the commit reaches the primary and only
  some peers (possibly none), then the pipeline breaks: the outcome is unknown;
* `roll` — the primary closes the spool's fragment on every member (a pulse / length
  roll), so closed fragments are produced and checked too;
* `crash` — kill -9 and restart of a member: its spool (and anything it had not
  persisted) is lost, it starts empty at offset 0 with epoch 0 (recovery.py without a
  graceful head; recovered closed fragments are not modelled).

What the real system guarantees, and so what is asserted. Spools are not the only
copy of acknowledged content in production (fragments persist to the store), but this
model has spools only, so it restricts itself to runs where acknowledged content stays
held somewhere: a member is a *holder* if it took part in the last successful sync (it
holds, or has rolled past, every acknowledged byte) and has not crashed since; a crash
never kills the last holder, and every new route includes a holder — the allocator's
"add before remove" keeps a route overlapping the last consistent one. Members outside
the current route are detached (reads go to route members), so their spools are only
checked again once a sync took them back. Under those rules, after every step:

1. acknowledged bytes never change: every member of the current route holds, in its
   spool's committed content and its closed fragments still on disk, exactly the
   acknowledged bytes at acknowledged offsets; and every fragment any member ever
   closed (handed to the persister) agrees with every acknowledgement, earlier or later;
2. after a successful sync every route member's spool ends where the primary's does,
   at or above every acknowledged offset;
3. no offset is acknowledged twice.

`QUIRE_SYNC_MODEL_EXAMPLES` raises the example count for a soak run.
"""

from __future__ import annotations

import logging
import os

from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from coordinator.replica import Replica
from coordinator.replicate_api import take_spool
from coordinator.spool import MemoryFiles
from protocol import Status

from .sync_driver import SyncFailed, member_id, route_of, run_sync

J = "model/journal"
_REPLICA_LOG = logging.getLogger("coordinator.replica")
N = 3


class Member(Replica):
    """A Replica that also remembers every fragment it ever closed (what it handed to
    the persister), with the bytes it closed it with."""

    def __init__(self, name: int, incarnation: int = 0) -> None:
        super().__init__(J, MemoryFiles())
        self.name = name
        self.incarnation = incarnation
        self.closed_log: list[tuple[int, int, bytes]] = []

    def on_closed(self, spool, fragment, file, primary):  # noqa: ANN001
        size = fragment.end - fragment.begin
        data = file.read_at(0, size) if file is not None else b""
        self.closed_log.append((fragment.begin, fragment.end, data))
        super().on_closed(spool, fragment, file, primary)

    def __repr__(self) -> str:
        s = self.spool
        return (f"m{self.name}#{self.incarnation}[{s.begin}-{s.end} epoch {s.epoch}@"
                f"{s.epoch_begin} head {self.head}]")


def _disagreement(begin: int, data: bytes, acked: list[tuple[int, int, bytes]]) -> str | None:
    """The first acknowledged span that `data` (held at `begin`) contradicts."""
    end = begin + len(data)
    for b, e, want in acked:
        lo, hi = max(b, begin), min(e, end)
        if lo < hi and data[lo - begin:hi - begin] != want[lo - b:hi - b]:
            return (f"offsets {lo}-{hi}: holds {data[lo - begin:hi - begin]!r}, acknowledged "
                    f"{want[lo - b:hi - b]!r} (append {b}-{e})")
    return None


class SyncModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        # Replicas log every cut and drop at WARNING: thousands per run, costly and
        # beside the point here (restored in teardown).
        self._log_level = _REPLICA_LOG.level
        _REPLICA_LOG.setLevel(logging.ERROR)
        self.members = [Member(i) for i in range(N)]
        self.revision = 0
        self.primary: int | None = None
        self.peers: tuple[int, ...] = ()
        self.healthy = False
        """The pipeline of the current route is synchronized and unbroken."""
        self.acked: list[tuple[int, int, bytes]] = []
        self.appends = 0
        self.holders: set[int] = set(range(N))
        self.graveyard: list[tuple[str, tuple[int, int, bytes]]] = []
        """Closed fragments of crashed incarnations (persisted or not, they were handed
        to the persister)."""

    def teardown(self) -> None:
        _REPLICA_LOG.setLevel(self._log_level)

    # -- helpers --------------------------------------------------------------------

    @property
    def route(self) -> tuple[int, ...]:
        return () if self.primary is None else (self.primary, *self.peers)

    def _end_streams(self) -> None:
        """The pipeline's replicate streams end: each peer rolls back what it had not
        committed (replicate_api's `finally`)."""
        for i in self.peers:
            self.members[i].spool.rollback()

    def _sync(self) -> None:
        """The new pipeline's streams take the peers' spools (replicate_api.take_spool:
        uncommitted content and a former primary's unacknowledged commits go), then the
        whole sync runs."""
        assert self.primary is not None
        p = self.members[self.primary]
        peers = [self.members[i] for i in self.peers]
        for m in peers:
            take_spool(m)
        route = route_of(self.primary, self.peers)
        # append_sync: the sync proposal exposes our end (peers behind roll past it),
        # so it is never dropped as unacknowledged afterwards.
        p.expose(p.spool.end)
        try:
            run_sync(p.spool, [m.spool for m in peers], self.revision, route=route,
                     peer_ids=[member_id(i) for i in self.peers])
        except SyncFailed as exc:
            raise AssertionError(f"{exc} — members {self.members}") from exc
        p.publish(p.spool.end)
        self.healthy = True
        self.holders = set(self.route)
        note(f"synced at revision {self.revision}: {[self.members[i] for i in self.route]}")
        # Invariant 2.
        ends = {self.members[i].spool.end for i in self.route}
        assert ends == {p.spool.end}, f"route members end apart after a sync: {self.members}"
        top = max((e for _, e, _ in self.acked), default=0)
        assert p.spool.end >= top, (f"synced end {p.spool.end} is below acknowledged "
                                    f"content ending at {top}: {self.members}")

    # -- rules ----------------------------------------------------------------------

    @initialize(data=st.data())
    def first_route(self, data: st.DataObject) -> None:
        self.new_route(data)

    @rule(data=st.data())
    def new_route(self, data: st.DataObject) -> None:
        # The first `size` of a permutation, the first of them primary; a holder stands
        # in for the last when none was drawn.
        order = data.draw(st.permutations(range(N)), label="order")
        size = data.draw(st.integers(1, min(3, N)), label="size")
        chosen = order[:size]
        if not self.holders & set(chosen):
            chosen[-1] = min(self.holders)
        primary, members = chosen[0], sorted(chosen)
        self._end_streams()
        self.revision += 1
        self.primary, self.peers = primary, tuple(m for m in members if m != primary)
        note(f"revision {self.revision}: route {members}, primary {primary}")
        self._sync()

    @precondition(lambda self: self.primary is not None and not self.healthy)
    @rule(bump=st.booleans())
    def resync(self, bump: bool) -> None:
        self._end_streams()
        if bump:
            self.revision += 1
        note(f"resync of route {self.route} at revision {self.revision}")
        self._sync()

    def _content(self, size: int) -> bytes:
        """Every append's bytes differ from every other's (generated bytes would mostly
        be zeros, and a stale tail of zeros over acknowledged zeros goes unnoticed)."""
        self.appends += 1
        return bytes([self.appends % 256]) * size

    @precondition(lambda self: self.healthy)
    @rule(size=st.integers(1, 6))
    def append(self, size: int) -> None:
        data = self._content(size)
        p = self.members[self.primary]
        if p.index_end > p.spool.end:  # validate_preconditions: INDEX_HAS_GREATER_OFFSET
            note(f"append refused: index_end {p.index_end} > spool end {p.spool.end}")
            return
        begin = p.spool.end
        for i in self.route:
            s = self.members[i].spool
            s.apply_content(s.delta, data)
        prop = p.spool.commit_proposal()
        answers = [p.spool.apply_proposal(prop, primary=True, epoch=self.revision)]
        answers += [self.members[i].spool.apply_proposal(prop, epoch=self.revision)
                    for i in self.peers]
        if any(a.status != Status.OK for a in answers):
            self.healthy = False
            note(f"append at {begin} not acknowledged: {[a.status.name for a in answers]}")
            return
        p.publish(prop.proposal.end)
        end = begin + len(data)
        for b, e, _ in self.acked:  # invariant 3
            assert e <= begin or end <= b, \
                f"offsets {begin}-{end} acknowledged twice (already {b}-{e}): {self.members}"
        self.acked.append((begin, end, data))
        note(f"acknowledged {data!r} at {begin}-{end}")

    @precondition(lambda self: self.healthy)
    @rule(size=st.integers(1, 6), reach=st.sets(st.integers(0, 2)), commit=st.booleans())
    def append_fails(self, size: int, reach: set[int], commit: bool) -> None:
        data = self._content(size)
        p = self.members[self.primary]
        begin = p.spool.end
        for i in self.route:
            s = self.members[i].spool
            s.apply_content(s.delta, data)
        if commit:
            prop = p.spool.commit_proposal()
            p.spool.apply_proposal(prop, primary=True, epoch=self.revision)
            for k, i in enumerate(self.peers):
                if k in reach:
                    self.members[i].spool.apply_proposal(prop, epoch=self.revision)
        got = [self.peers[k] for k in sorted(reach) if k < len(self.peers)] if commit else []
        note(f"append {data!r} at {begin} fails: commit {'to primary + ' + str(got) if commit else 'never sent'}")
        self.healthy = False

    @precondition(lambda self: self.healthy)
    @rule()
    def roll(self) -> None:
        p = self.members[self.primary]
        prop = p.spool.roll_proposal(acknowledge=False)
        for i in self.route:
            resp = self.members[i].spool.apply_proposal(prop, primary=i == self.primary,
                                                        epoch=self.revision)
            assert resp.status == Status.OK, (i, resp, self.members)
        note(f"rolled at {prop.proposal.end}")

    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        # Never the last holder: some live member must keep what was acknowledged.
        i = data.draw(st.sampled_from([i for i in range(N) if self.holders - {i}]),
                      label="crash")
        old = self.members[i]
        self.graveyard += [(repr(old), c) for c in old.closed_log]
        self.members[i] = Member(i, old.incarnation + 1)
        self.holders.discard(i)
        if i in self.route:
            self.healthy = False
        note(f"crash of m{i} (was {old})")

    # Route changes and appends (acknowledged or not) twice as often as the rest: the
    # sequences that matter interleave them (hypothesis picks rules uniformly).
    @rule(data=st.data())
    def another_route(self, data: st.DataObject) -> None:
        self.new_route(data)

    @precondition(lambda self: self.healthy)
    @rule(size=st.integers(1, 6))
    def another_append(self, size: int) -> None:
        self.append(size)

    @precondition(lambda self: self.healthy)
    @rule(size=st.integers(1, 6), reach=st.sets(st.integers(0, 2)), commit=st.booleans())
    def another_failed_append(self, size: int, reach: set[int], commit: bool) -> None:
        self.append_fails(size, reach, commit)

    # -- invariants -----------------------------------------------------------------

    @invariant()
    def acknowledged_bytes_never_change(self) -> None:
        acked = self.acked
        if not acked:
            return
        for i in self.route:
            m = self.members[i]
            s = m.spool
            bad = _disagreement(s.begin, s.read_committed(s.begin, s.content_length), acked)
            assert bad is None, f"{m} spool {bad}; members {self.members}"
            for lf in m.local:
                f = lf.fragment
                held = lf.file.read_at(0, f.end - f.begin) if lf.file is not None else b""
                bad = _disagreement(f.begin, held, acked)
                assert bad is None, f"{m} closed fragment {f.begin}-{f.end}: {bad}"
        closed = [(repr(m), c) for m in self.members for c in m.closed_log] + self.graveyard
        for who, (b, e, held) in closed:
            bad = _disagreement(b, held, acked)
            assert bad is None, f"{who} closed (persisted) a fragment {b}-{e} with {bad}"

    @invariant()
    def a_healthy_route_agrees(self) -> None:
        if self.healthy:
            ends = {self.members[i].spool.end for i in self.route}
            assert len(ends) == 1, self.members


_EXAMPLES = int(os.environ.get("QUIRE_SYNC_MODEL_EXAMPLES", "150"))

TestSyncModel = SyncModel.TestCase
TestSyncModel.settings = settings(max_examples=_EXAMPLES, stateful_step_count=30, deadline=None,
                                  suppress_health_check=[HealthCheck.too_slow])
