"""The append FSM's steady state in one step: the whole-append lane, with group commit.

When a plain append (no offset, registers, suspension, producer or proxy header) reaches
the journal's primary whole — request, chunks and commit already in the connection's
buffer — and the journal's pipeline is synchronized, idle (its send lock free, nobody
queued for it) and on the route of the cached resolution, every state of the seed's FSM
from RESOLVE to STREAM_CONTENT takes its no-op common case (append_fsm.py's
`_fast_<state>` functions) and STREAM_CONTENT finds nothing to wait for. `try_lane`
takes that walk as one call: the same checks, the same spool and peer writes. When any
check fails it returns None with nothing consumed, and the append takes the FSM, which
handles every other case (and decides the failures).

**Group commit.** The first lane append of a loop turn opens a `Batch`: it takes
`pipeline_lock` (without awaiting: it is free and nobody waits) and schedules the
batch's commit for the end of the turn. Every lane append of the same journal in that
turn adds its content behind the last one's; then one commit proposal covers them all,
and one acknowledgement from each peer answers every append of the batch — each with
its own commit span and SHA-1, as if committed alone. Holding the lock across the turn
keeps every other writer (the FSM, a sync, the drain) out, as the FSM's own hold does.
A batch of one append proposes exactly what the FSM would. Nothing in a batch is
acknowledged unless the whole batch is; a failure before its commit leaves (a broken
pipeline, a torn-down route, a local write that failed) fails every append of it
definitely (UNAVAILABLE, the content rolled back), after it as COMMIT_UNKNOWN
(`append_rules.decide_broken`).

`finish` is READ_ACKNOWLEDGEMENTS and the answer (`answer`), as the FSM gives it.
tests/coordinator/test_append_lane.py drives both paths over the same appends and
compares what they write, propose and answer; test_append_batch.py the group commit.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any, Protocol

from protocol import (AppendChunk, AppendCommit, AppendRequest, AppendResponse, Fragment, LabelSet,
                      ProcessId, ReplicateProposal, ReplicateResponse, Route, Status)
from protocol.spec import SuspendLevel
from protocol.stream import FrameStream
from protocol.wire import encode_frame

from . import metrics
from .append_rules import Decision, decide_broken
from .pipeline import PipelineBroken
from .replica import Replica

__all__ = ["Batch", "Lane", "answer", "finish", "ok_header", "try_lane"]

_CHUNK = (AppendChunk.KIND, bytes(encode_frame(AppendChunk())[0][9:]))
_COMMIT = (AppendCommit.KIND, bytes(encode_frame(AppendCommit())[0][9:]))
"""(kind, header bytes) of the frames a client streams an append's content with."""


class LanePipeline(Protocol):
    """What the lane uses of a pipeline.Pipeline. A Protocol, not the class: Pipeline is
    compiled too, and a compiled signature naming it would refuse the tests' fakes
    (tests/coordinator/fake_pipeline.py), as `ProxiedSource` does for the proxy."""

    broken: BaseException | None
    synced: bool

    @property
    def route(self) -> Route: ...

    def send_content(self, data: bytes | memoryview) -> None: ...

    def send_proposal(self, prop: ReplicateProposal, first: bool = False) -> ReplicateResponse: ...

    def write_local(self) -> None: ...

    def writable(self) -> bool: ...

    async def drain(self) -> None: ...

    def ticket(self, must_ok: bool = False, fut: asyncio.Future | None = None
               ) -> asyncio.Future[list[tuple[ProcessId, ReplicateResponse]]]: ...


class Batch:
    """The lane appends of one journal in one loop turn, committed together at its end."""

    __slots__ = ("replica", "pipeline", "res", "delta", "appends", "done", "error", "failed")

    def __init__(self, replica: Replica, pipeline: LanePipeline, res: Any) -> None:
        self.replica = replica
        self.pipeline = pipeline
        self.res = res
        self.delta = 0
        """Content bytes its appends put on the spool (the spool's delta)."""
        self.appends = 0
        loop = asyncio.get_running_loop()
        self.done: asyncio.Future[Any] = loop.create_future()
        """The commit's ticket: resolved once every peer acknowledged it."""
        self.error: Decision | None = None
        """Set if the commit failed to leave (or the local spool refused it)."""
        self.failed: BaseException | None = None
        """An append of the batch failed while streaming: the batch must not commit."""
        # The commit, at the end of this turn: scheduled before the first append's
        # content is queued on the peer streams, so it joins that content's write.
        loop.call_soon(_commit, self)


class Lane:
    """One append taken by the lane: its batch and what its answer needs."""

    __slots__ = ("res", "replica", "pipeline", "batch", "commit", "registers", "chunks",
                 "error", "known")

    def __init__(self, res: Any, replica: Replica, pipeline: LanePipeline, batch: Batch,
                 chunks: int, known: int = 0) -> None:
        self.res = res
        self.replica = replica
        self.pipeline = pipeline
        self.batch = batch
        self.chunks = chunks
        self.known = known
        """The client's route revision (AppendRequest.route_revision)."""
        self.commit: Fragment | None = None
        self.registers: LabelSet | None = None
        self.error: Decision | None = None


def ok_header(header: Any, known: int) -> Any:
    """An OK answer's header: none when the client's route came from a header of this
    same revision (AppendRequest.route_revision), which it would only repeat."""
    return None if known and header.etcd.revision == known else header


def _plain(req: AppendRequest) -> bool:
    return (req.header is None and not req.offset and not req.producer
            and req.check_registers is None and req.union_registers is None
            and req.subtract_registers is None and req.suspend == "resume"
            and not req.roll_below)


def _route_holds(res: Any, pln: LanePipeline) -> bool:
    """The decisions that depend only on the resolution and the pipeline (cached on
    the replica while both are the same objects): AWAIT_DESIRED_REPLICAS says
    VALIDATE_PRECONDITIONS, START_PIPELINE reuses `pln`, UPDATE_ASSIGNMENTS has nothing
    to advertise, and the spec neither suspends, forbids writes nor limits the rate."""
    spec, route = res.spec, res.route
    return (res.status == Status.OK and res.is_primary
            and 0 < len(route.members) == spec.desired_replication()
            and pln.route.equivalent(route) and pln.route.endpoints == route.endpoints
            and all(a.value is not None and a.value.equivalent(route) for a in res.assignments)
            and spec.suspend.level == SuspendLevel.NONE and spec.writable
            and spec.max_append_rate <= 0)


def try_lane(broker: Any, conn: FrameStream, req: AppendRequest) -> Lane | None:
    """Take the append whole, if the lane's conditions hold (module docstring)."""
    if not _plain(req):
        return None
    replicas = getattr(broker, "replicas", None)
    replica: Replica | None = replicas.get(req.journal) if replicas is not None else None
    if replica is None:
        return None
    ks = broker.keyspace
    res = replica.cached_resolution(ks.revision, req.min_etcd_revision)
    pln: LanePipeline | None = replica.pipeline
    if res is None or pln is None or pln.broken is not None or not pln.synced \
            or ks.changed_revision > res.header.etcd.revision:
        return None
    batch: Batch | None = replica.batch
    if batch is None:
        if not replica.pipeline_lock.free():
            return None  # an append holds or awaits the pipeline: queue behind it (FSM)
    elif batch.pipeline is not pln or batch.res is not res or batch.failed is not None:
        return None  # (the batch's commit, at the turn's end, sorts it out: FSM meanwhile)
    lane_of = replica.lane
    if lane_of is None or lane_of[0] is not res or lane_of[1] is not pln:
        if not _route_holds(res, pln):
            return None
        replica.lane = (res, pln)
    spool = replica.spool
    health = replica.health
    if health is not None and health.refusal() is not None:
        return None  # a full or failed spool: the FSM refuses the append (spool_health.py)
    if spool.delta != (batch.delta if batch is not None else 0) \
            or (not replica.index_ready and broker.index_expected) \
            or res.spec.suspend.offset > spool.end or replica.index_end > spool.end \
            or not pln.writable():
        return None  # VALIDATE_PRECONDITIONS has work (or a peer must drain): FSM
    frag = res.spec.fragment
    roll = spool.should_roll(frag.length, frag.compression_codec, frag.flush_interval)
    if roll and batch is not None:
        return None  # a roll would drop the batch's content: the FSM rolls after its commit
    chunks = conn.take_run(_CHUNK, _COMMIT)
    if chunks is None:
        return None  # not all here yet (or not a plain chunk run): FSM
    if batch is None:
        taken = replica.pipeline_lock.try_acquire()
        assert taken, "the pipeline lock was free above, and nothing was awaited since"
        batch = replica.batch = Batch(replica, pln, res)
    return _stream(req, res, replica, pln, chunks, batch, roll)


def _stream(req: AppendRequest, res: Any, replica: Replica, pln: LanePipeline,
            chunks: list[bytes], batch: Batch, roll: bool) -> Lane:
    """STREAM_CONTENT with every chunk at hand, into the batch (its commit follows)."""
    lane = Lane(res, replica, pln, batch, len(chunks), req.route_revision)
    spool = replica.spool
    try:
        if roll:  # (only a batch's first append rolls: the spool holds no delta yet)
            frag = res.spec.fragment
            pln.send_proposal(spool.roll_proposal(codec=frag.compression_codec, acknowledge=False))
        begin = spool.end + spool.delta
        summer = hashlib.sha1()
        for chunk in chunks:
            pln.send_content(chunk)
            summer.update(chunk)
        batch.delta = spool.delta
        batch.appends += 1
        lane.commit = Fragment(journal=req.journal, begin=begin, end=spool.end + spool.delta,
                               sum=summer.hexdigest(), codec=spool.fragment.codec)
        lane.registers = spool.registers
    except PipelineBroken as exc:
        lane.error = decide_broken(False, str(exc), exc)  # content only: nothing committed
        batch.failed = batch.failed or exc
    except BaseException as failure:
        batch.failed = batch.failed or failure  # the batch rolls back instead of committing
        raise
    return lane


def _commit(batch: Batch) -> None:
    """The batch's one commit, at the end of the loop turn that opened it; then the
    pipeline lock is free again."""
    replica, pln = batch.replica, batch.pipeline
    spool = replica.spool
    if replica.batch is batch:
        replica.batch = None
    done = batch.done
    commit_sent = False
    try:
        if batch.failed is not None:
            raise PipelineBroken(f"an append of the same commit failed: {batch.failed!r}")
        if replica.pipeline is not pln:
            raise PipelineBroken("the pipeline was torn down before the commit")
        pln.write_local()  # (a spool that cannot write fails the batch here, definitely)
        prop = spool.commit_proposal()
        # From here a peer may adopt the commit: a failure is COMMIT_UNKNOWN (a pipeline
        # already broken sends nothing, so that stays definite).
        commit_sent = pln.broken is None
        local = pln.send_proposal(prop)
        if local.status != Status.OK:
            raise PipelineBroken(f"local spool refused its own proposal: {local.status.name}")
        pln.ticket(must_ok=True, fut=done)
        metrics.HOT.commits += 1
    except Exception as exc:  # noqa: BLE001 - every append of the batch gets the answer
        batch.error = decide_broken(commit_sent, str(exc), exc)
        if not commit_sent and pln.broken is None and replica.pipeline is pln and spool.delta:
            # As the FSM's run_to leaves mid-stream: the bytes never ride with a later commit.
            try:
                pln.send_proposal(spool.rollback_proposal(acknowledge=False))
            except PipelineBroken:
                pass
        if not done.done():
            done.set_exception(exc)
            done.exception()  # (retrieved: each append's answer reads batch.error)
    finally:
        replica.pipeline_lock.release()


def answer(lane: Lane, failure: BaseException | None = None) -> AppendResponse:
    """The append's answer once its batch's ticket resolved (READ_ACKNOWLEDGEMENTS), or
    failed with `failure`: as the FSM gives it."""
    header = lane.res.header
    d = lane.error if lane.error is not None else lane.batch.error
    if d is None and failure is not None:
        d = decide_broken(True, f"replication failed: {failure!r}")
    if d is not None:
        return AppendResponse(status=d.status, header=header, registers=lane.registers,
                              total_chunks=lane.chunks, message=d.message)
    commit = lane.commit
    assert commit is not None
    lane.replica.publish(commit.end)
    return AppendResponse(status=Status.OK, header=ok_header(header, lane.known), commit=commit,
                          registers=lane.registers, total_chunks=lane.chunks)


async def finish(lane: Lane) -> AppendResponse:
    """Wait for the append's acknowledgements, then its answer (`answer`)."""
    failure = None
    if lane.error is None:
        if not lane.pipeline.writable():
            try:
                await lane.pipeline.drain()  # as the FSM's hand-off
            except Exception:  # noqa: BLE001 - broken: the batch's commit sees it
                pass
        try:
            await lane.batch.done
        except Exception as exc:  # noqa: BLE001 - the FSM's READ_ACKNOWLEDGEMENTS
            failure = exc
    return answer(lane, failure)
