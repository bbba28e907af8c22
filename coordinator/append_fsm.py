"""The append state machine (the seed's append_fsm), as an explicit FSM.

`State` names the seed's states; `TRANSITIONS` lists its edges (append_rules.py, where
the pure decisions live). `AppendFSM` is the thin asyncio adapter: one `_on_<state>`
coroutine per state performs the IO of that state and asks a pure decision for the next
state; `run_to()` loops until a terminal state (FINISHED, ERROR or PROXY) and checks
every transition against the table. The seed's common case (a synchronized pipeline
whose route is the resolution's) walks the same states, but each no-op state is a plain
`_fast_<state>` call (no coroutine), and RESOLVE reuses the replica's last resolution
while the keyspace revision has not moved.

The pipeline states (ACQUIRE_PIPELINE .. UPDATE_ASSIGNMENTS, which do real work only
after a route change) are a mixin in append_sync.py, STREAM_CONTENT and
READ_ACKNOWLEDGEMENTS one in append_stream.py; here are the loop and the states
before the pipeline. Suspension (the digest's UpdateSuspend is an action of RESOLVE and
VALIDATE_PRECONDITIONS, not a state of its own) is the `SuspendStates` mixin in
coordinator/suspend.py, beside the etcd write it makes.

Ownership (seed, "Components"): ACQUIRE_PIPELINE takes `replica.pipeline_lock` (the
send side); START_PIPELINE builds a pipeline, which takes `replica.spool_lock` for its
lifetime; STREAM_CONTENT sends content and the commit (or a rollback) and then
releases the send side after taking a receive-side ticket, so the next append streams
while this one waits for its acknowledgements in READ_ACKNOWLEDGEMENTS.

Failure answers (`append_rules.decide_broken`): a failure before the commit proposal
left this broker is definite (UNAVAILABLE or the state's own status; replicas roll the
content back). Once the commit was sent to any peer (`commit_sent`) — the pipeline
breaks while sending or draining it, an acknowledgement is not OK or times out — the
answer is COMMIT_UNKNOWN: a peer may adopt the commit at the next pipeline sync, so
the client must not re-send it as if it had certainly failed.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from protocol.logs import get_logger
from protocol import AppendRequest, Fragment, LabelSet, Status, Suspend

from .append_rules import (
    TERMINAL,
    AppendAborted,
    TRANSITIONS,
    Decision,
    State,
    go,
    decide_replicas,
    decide_resolve,
    validate_preconditions,
)
from .append_eo import ExactlyOnceStates
from .append_stream import NOT_BUFFERED, ContentSource, StreamStates
from .append_sync import LOCK_TIMEOUT, PipelineSyncStates
from .pipeline import Pipeline, PipelineBroken
from .replica import Replica
from .suspend import SuspendStates

__all__ = ["AppendAborted", "AppendFSM", "ContentSource", "NOT_BUFFERED", "State", "TRANSITIONS"]

log = get_logger(__name__)

MAX_RESOLVES = 30
INDEX_WAIT = 10.0
"""Seconds a primary waits for its replica's first fragment-index load before an
append fails UNAVAILABLE (the client retries)."""


class Broker(Protocol):
    """What the FSM needs of the coordinator (server.py implements it)."""

    me: Any
    keyspace: Any

    async def resolve(self, journal: str, min_revision: int = 0) -> Any: ...
    def replica(self, journal: str) -> Replica: ...
    async def advertise_route(self, journal: str, route: Any) -> int: ...
    async def teardown_pipeline(self, replica: Replica) -> None: ...
    async def update_suspend(self, journal: str, suspend: Suspend) -> int: ...


class AppendFSM(SuspendStates, PipelineSyncStates, StreamStates, ExactlyOnceStates):
    def __init__(self, broker: Broker, req: AppendRequest, source: ContentSource) -> None:
        self.broker = broker
        self.req = req
        self.source = source
        self.state = State.RESOLVE
        self.trace: list[State] = [State.RESOLVE]
        self.res: Any = None
        self.replica: Replica | None = None
        self.pipeline: Pipeline | None = None
        self.owns_pipeline = False
        self.read_through = 0
        self.roll_to: int | None = None
        self.roll_registers: LabelSet | None = None
        self.roll_producers = None
        self.roll_epoch: tuple[int, int, tuple[tuple[int, int], ...]] = (0, 0, ())
        """With roll_to: (epoch, epoch_begin, epoch history) of the content ending there."""
        self.original: Fragment | None = None
        """An identified append that already committed: its original commit (the answer;
        nothing is written again). producers.py."""
        self.status = Status.OK
        self.message = ""
        self.commit: Fragment | None = None
        self.commit_sent = False
        """A commit proposal carrying this append's content may have reached a peer:
        from then on a failure is COMMIT_UNKNOWN, never a definite status."""
        self.registers: LabelSet | None = None
        self.total_chunks = 0
        self.delayed_chunks = 0
        self._ticket: Any = None
        self._aborted: AppendAborted | None = None
        self._resolves = 0
        self._suspend: Suspend | None = None
        self._resumed_until = 0.0
        """Monotonic deadline while a journal we resumed waits for its replicas."""

    @property
    def _log(self):  # noqa: ANN202 - bound lazily: off the hot path
        return log.bind(journal=self.req.journal)

    # -- the loop ---------------------------------------------------------------------

    async def run_to(self, *targets: State) -> State:
        stop = TERMINAL.union(targets)
        handlers, fast = _HANDLERS, _FAST
        try:
            while self.state not in stop:
                # The common case of a state (a synchronized pipeline whose route matches
                # the resolution) is decided without a coroutine; anything else, or any
                # state that has to wait, goes through its `_on_<state>` handler.
                quick = fast.get(self.state)
                if quick is not None and quick(self):
                    continue
                await handlers[self.state](self)
        finally:
            if self.owns_pipeline:
                self._abandon()
                await self._release_pipeline()
        return self.state

    def _abandon(self) -> None:
        """Leaving mid-stream (cancelled, or an unexpected error): roll back our bytes so
        they can never ride along with the next append's commit."""
        pln = self.pipeline
        if pln is not None and pln.broken is None and pln.spool.delta:
            try:
                pln.send_proposal(pln.spool.rollback_proposal(acknowledge=False))
            except PipelineBroken:
                pass

    async def run(self) -> State:
        return await self.run_to(*TERMINAL)

    def _go(self, decision: Decision | State) -> None:
        d = decision if isinstance(decision, Decision) else go(decision)
        if d.state not in TRANSITIONS[self.state]:
            raise AssertionError(f"illegal transition {self.state.name} -> {d.state.name}")
        if d.state is State.ERROR:
            self.status, self.message = d.status, d.message
        self.state = d.state
        self.trace.append(d.state)

    def _fail(self, status: Status, message: str) -> None:
        self._go(Decision(State.ERROR, status, message))

    # -- states -----------------------------------------------------------------------

    async def _on_resolve(self) -> None:
        self._resolves += 1
        if self._resolves > MAX_RESOLVES:
            return self._fail(Status.UNAVAILABLE, "the route did not settle")
        hdr = self.req.header
        min_rev = max(self.req.min_etcd_revision, hdr.etcd.revision if hdr else 0, self.read_through)
        res = self._cached_resolution(min_rev)
        if res is None:
            res = await self.broker.resolve(self.req.journal, min_rev)
        self.res = res
        if res.status != Status.OK and res.spec is not None and not res.route.members:
            if await self._resolve_unassigned(res):
                return  # RESOLVE again (the seed: "this state may be re-entered")
        d = decide_resolve(res.status, res.is_primary, self.owns_pipeline)
        if d.state is State.ERROR:
            d = Decision(State.ERROR, res.status, getattr(res, "message", "") or d.message)
        if d.state is State.AWAIT_DESIRED_REPLICAS and self.owns_pipeline:
            await self._release_pipeline()  # no longer primary: let the pipeline go
        if res.status == Status.OK and res.is_primary:
            self.replica = replica = self.broker.replica(self.req.journal)
            replica.resolution = res
        self._go(d)

    # -- synchronous common cases (each returns False to defer to its handler) -----------

    def _fast_resolve(self) -> bool:
        if self._resolves >= MAX_RESOLVES:
            return False
        hdr = self.req.header
        min_rev = max(self.req.min_etcd_revision, hdr.etcd.revision if hdr else 0, self.read_through)
        res = self._cached_resolution(min_rev)
        if res is None:
            return False
        # A cached resolution is an OK one with us as primary (see _on_resolve).
        self._resolves += 1
        self.res = res
        self.replica = self.broker.replicas[self.req.journal]
        self._go(decide_resolve(res.status, res.is_primary, self.owns_pipeline))
        return True

    def _fast_await_desired_replicas(self) -> bool:
        res = self.res
        d = decide_replicas(len(res.route.members), res.spec.desired_replication(), res.is_primary,
                            res.route.primary >= 0, self.req.do_not_proxy)
        if d.state is State.RESOLVE or (d.status == Status.INSUFFICIENT_JOURNAL_BROKERS
                                        and self._resumed_until):
            return False  # wait for the allocator's next change
        self._go(d)
        return True

    def _fast_validate_preconditions(self) -> bool:
        replica = self.replica
        assert replica is not None
        if not replica.index_ready and getattr(self.broker, "index_expected", False):
            return False  # the index's end guards the write head: wait for its first load
        if self.req.producer and self._check_producer(replica):
            return True
        d = validate_preconditions(self.req, self.res.spec, replica.spool.registers,
                                   replica.spool.end, replica.index_end,
                                   getattr(self.res, "route", None))
        if d.suspend is not None:
            return False  # the spec must be written first (_on_validate_preconditions)
        if d.status == Status.REGISTER_MISMATCH:
            self.registers = replica.spool.registers
        if d.state is State.SEND_PIPELINE_SYNC:
            self.roll_to = d.roll_to
        self._go(d)
        return True

    def _cached_resolution(self, min_rev: int):  # noqa: ANN202
        replicas = getattr(self.broker, "replicas", None)
        replica = replicas.get(self.req.journal) if replicas is not None else None
        return replica.cached_resolution(self.broker.keyspace.revision, min_rev) if replica else None

    def _route_valid(self) -> bool:
        ks = self.broker.keyspace
        return ks.changed_revision <= self.res.header.etcd.revision

    async def _on_await_desired_replicas(self) -> None:
        res = self.res
        if self._resumed_until > time.monotonic() and len(res.route.members) < res.spec.desired_replication():
            # We just resumed the journal: the allocator is adding its replicas back.
            await self.broker.keyspace.wait_changed(res.header.etcd.revision,
                                                    self._resumed_until - time.monotonic())
            self._resolves -= 1
            return self._go(State.RESOLVE)
        if self._fast_await_desired_replicas():
            return
        # decide_replicas said RESOLVE: the allocator is about to remove a member.
        await self.broker.keyspace.wait_changed(self.res.header.etcd.revision, LOCK_TIMEOUT)
        self._go(State.RESOLVE)

    async def _on_validate_preconditions(self) -> None:
        if self._fast_validate_preconditions():
            return
        replica = self.replica
        assert replica is not None
        if not replica.index_ready and getattr(self.broker, "index_expected", False):
            return await self._await_first_index(replica)
        if self.req.producer and self._check_producer(replica):
            return
        d = validate_preconditions(self.req, self.res.spec, replica.spool.registers,
                                   replica.spool.end, replica.index_end,
                                   getattr(self.res, "route", None))
        self._suspend = d.suspend
        await self._update_suspend()  # then RESOLVE, at the revision of the write

    async def _await_first_index(self, replica: Replica) -> None:
        """Gazette's WaitForFirstRemoteRefresh: a primary whose replica has not loaded
        the fragment index yet (just created; Redis slow or away) does not know how far
        the journal was persisted. Members that all lost their spools would otherwise
        sync at their (empty) spool's offset — 0 — and acknowledge appends at offsets
        the store already holds; with the index, INDEX_HAS_GREATER_OFFSET stops that."""
        deadline = time.monotonic() + INDEX_WAIT
        while not replica.index_ready and (left := deadline - time.monotonic()) > 0:
            await replica.wait_change(left)
        if not replica.index_ready:
            return self._fail(Status.UNAVAILABLE, f"the fragment index of {self.req.journal} "
                              f"is not loaded yet (is Redis reachable?)")
        await self._on_validate_preconditions()

    async def _release_pipeline(self) -> None:
        if self.owns_pipeline and self.replica is not None:
            self.owns_pipeline = False
            self.replica.pipeline_lock.release()

    async def _on_error(self) -> None:  # pragma: no cover - terminal: run_to stops first
        raise AssertionError("terminal")

    _on_proxy = _on_finished = _on_error


_HANDLERS = {state: getattr(AppendFSM, "_on_" + state.name.lower()) for state in State}
_FAST = {state: getattr(AppendFSM, "_fast_" + state.name.lower()) for state in State
         if hasattr(AppendFSM, "_fast_" + state.name.lower())}

