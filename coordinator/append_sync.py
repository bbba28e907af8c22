"""The append FSM's pipeline states: acquiring, (re)building and synchronizing it.

ACQUIRE_PIPELINE, START_PIPELINE, SEND_PIPELINE_SYNC, RECV_PIPELINE_SYNC and
UPDATE_ASSIGNMENTS (the seed's states of the same names) as a mixin of `AppendFSM`
(append_fsm.py), which holds the loop, RESOLVE, the precondition checks and the
content/acknowledgement states. They are split along this seam because these states
run only when the pipeline is missing, stale or unsynchronized (a route change), while
the others run on every append. Each state keeps its `_on_<state>` handler here, and
the synchronous common case of a state is its `_fast_<state>`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from protocol import LabelSet, Status
from protocol.auth import Capability
from protocol.errors import QuireError

from .append_rules import Decision, State, decide_acquired, decide_assignments, decide_start, decide_sync
from .fence import PrimaryFence
from .pipeline import Pipeline, PipelineBroken
from .replica import acquire_within

if TYPE_CHECKING:
    from .replica import Replica

LOCK_TIMEOUT = 30.0


class PipelineSyncStates:
    """Mixin: needs AppendFSM's attributes and `_go` / `_fail` / `_route_valid`."""

    broker: Any
    req: Any
    res: Any
    replica: Replica | None
    pipeline: Pipeline | None
    owns_pipeline: bool
    read_through: int
    roll_to: int | None
    roll_registers: LabelSet | None
    roll_producers: Any
    roll_epoch: tuple[int, int, tuple[tuple[int, int], ...]]
    _ticket: Any

    def _go(self, decision: Decision | State) -> None: ...
    def _fail(self, status: Status, message: str) -> None: ...
    def _route_valid(self) -> bool: ...
    @property
    def _log(self) -> Any: ...

    # -- ACQUIRE_PIPELINE ---------------------------------------------------------------

    async def _on_acquire_pipeline(self) -> None:
        assert self.replica is not None
        if not await acquire_within(self.replica.pipeline_lock, LOCK_TIMEOUT):
            return self._fail(Status.UNAVAILABLE, "timed out waiting for the pipeline")
        self.owns_pipeline = True
        self._go(decide_acquired(self._route_valid()))

    # -- START_PIPELINE -----------------------------------------------------------------

    def _fast_start_pipeline(self) -> bool:
        pln = self.replica.pipeline  # type: ignore[union-attr]
        if pln is None or pln.broken is not None or not pln.synced:
            return False
        d = decide_start(pln.route, True, self.res.route, True)
        if d.state is not State.UPDATE_ASSIGNMENTS:
            return False
        self.pipeline = pln
        self._go(d)
        return True

    async def _on_start_pipeline(self) -> None:
        replica = self.replica
        assert replica is not None
        if self._fast_start_pipeline():
            return
        pln = replica.pipeline
        d = decide_start(None, False, self.res.route, True)  # rebuild and sync
        if pln is not None:
            await self.broker.teardown_pipeline(replica)
        if not await acquire_within(replica.spool_lock, LOCK_TIMEOUT):
            return self._fail(Status.UNAVAILABLE, "timed out waiting for the spool")
        if not self._route_valid():
            replica.spool_lock.release()
            return self._go(State.RESOLVE)
        try:
            peer_auth = getattr(self.broker, "peer_auth", None)
            self.pipeline = await Pipeline.open(
                replica, self.res.header, self.broker.me,
                mux=getattr(self.broker, "replicate_mux", None),
                **(peer_auth(Capability.REPLICATE, replica.journal) if peer_auth else {}))
        except PipelineBroken as exc:
            replica.spool_lock.release()
            return self._fail(Status.UNAVAILABLE, str(exc))
        resolver = getattr(getattr(self.broker, "topology", None), "resolver", None)
        if resolver is not None:
            self.pipeline.fence = PrimaryFence(resolver, replica.journal, self.res.route,
                                               self.res.header.etcd.revision)
        replica.pipeline = self.pipeline
        self._go(d)

    # -- SEND_PIPELINE_SYNC / RECV_PIPELINE_SYNC ----------------------------------------

    async def _on_send_pipeline_sync(self) -> None:
        pln, spool = self.pipeline, self.replica.spool  # type: ignore[union-attr]
        assert pln is not None
        # Every synchronizing proposal carries the producer table (exactly-once appends):
        # a replica it rolls forward adopts it with the registers; when rolling forward
        # to a peer that is ahead, it is that peer's table.
        producers = self.roll_producers
        if producers is None:
            producers = spool.producers.snapshot()
        if self.roll_to is not None:
            epoch, epoch_begin, epochs = self.roll_epoch
            prop = spool.roll_proposal(self.roll_to, registers=self.roll_registers,
                                       producers=producers, epoch=epoch, epoch_begin=epoch_begin,
                                       epochs=epochs)
            self._log.info("rolling spool in sync", roll_to=self.roll_to, epoch=epoch,
                           epoch_begin=epoch_begin)
            self.roll_to = self.roll_registers = self.roll_producers = None
            self.roll_epoch = (0, 0, ())
        else:
            prop = spool.rollback_proposal(acknowledge=True, producers=producers, epoch=True)
            self.replica.expose(spool.end)  # peers behind it will roll past it
        try:
            pln.send_proposal(prop, first=True)
            self._ticket = pln.ticket()
            await pln.drain()
        except PipelineBroken as exc:
            return self._fail(Status.UNAVAILABLE, str(exc))
        self._go(State.RECV_PIPELINE_SYNC)

    async def _on_recv_pipeline_sync(self) -> None:
        pln, replica = self.pipeline, self.replica
        assert pln is not None and replica is not None and self._ticket is not None
        try:
            responses = await pln.gather(self._ticket)
        except Exception as exc:  # noqa: BLE001 - a broken peer fails this append
            await self.broker.teardown_pipeline(replica)
            return self._fail(Status.UNAVAILABLE, f"pipeline sync failed: {exc!r}")
        for _pid, resp in responses:
            if resp.status in (Status.SPOOL_FULL, Status.SPOOL_FAILED):
                # A peer whose spool cannot write (spool_health.py): nothing was written,
                # the append is refused with its reason (it names the member).
                await self.broker.teardown_pipeline(replica)
                return self._fail(resp.status, resp.message or f"peer {_pid}: {resp.status.name}")
        d = decide_sync(responses, replica.spool.fragment, pln.route, pln.revision,
                        replica.spool.epoch, replica.spool.epoch_begin, replica.spool.epochs)
        if d.state is State.UPDATE_ASSIGNMENTS:
            pln.synced = True
            # Bytes the spool holds after a sync are part of the journal now (at worst
            # at-least-once leftovers of a failed append): readers may see them.
            replica.publish(replica.spool.end)
        elif d.state is State.SEND_PIPELINE_SYNC:
            self.roll_to, self.roll_registers = d.roll_to, d.registers
            self.roll_producers, self.roll_epoch = d.producers, (d.epoch, d.epoch_begin, d.epochs)
        else:
            await self.broker.teardown_pipeline(replica)
            self.read_through = max(self.read_through, d.read_through)
        self._go(d)

    # -- UPDATE_ASSIGNMENTS -------------------------------------------------------------

    def _fast_update_assignments(self) -> bool:
        d = decide_assignments([a.value for a in self.res.assignments], self.res.route)
        if d.state is State.RESOLVE:
            return False  # the route must be advertised first
        self._go(d)
        return True

    async def _on_update_assignments(self) -> None:
        if self._fast_update_assignments():
            return
        try:  # decide_assignments said RESOLVE: advertise the route first
            rev = await self.broker.advertise_route(self.req.journal, self.res.route)
        except QuireError as exc:
            # Assignments moved under us: re-resolve and decide again.
            self._log.info("advertising the route failed; re-resolving", error=str(exc))
            rev = self.broker.keyspace.revision + 1
        self.read_through = max(self.read_through, rev)
        self._go(State.RESOLVE)
