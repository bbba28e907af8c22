"""The append FSM's steady state in one step: the whole-append lane.

When a plain append (no offset, registers, suspension, producer or proxy header) reaches
the journal's primary whole — request, chunks and commit already in the connection's
buffer — and the journal's pipeline is synchronized, idle (its send lock free, nobody
queued for it) and on the route of the cached resolution, every state of the seed's FSM
from RESOLVE to STREAM_CONTENT takes its no-op common case (append_fsm.py's
`_fast_<state>` functions) and STREAM_CONTENT finds nothing to wait for. `try_lane`
takes that walk as one call: the same checks, the same spool and peer writes, the same
proposals, then a receive-side ticket. Nothing awaits between its first check and the
ticket, so no other append can interleave — what holding `pipeline_lock` guarantees on
the FSM's path. When any check fails it returns None with nothing consumed, and the
append takes the FSM, which handles every other case (and decides the failures).

`finish` is READ_ACKNOWLEDGEMENTS and the answer (`answer`), as the FSM gives it: OK
with the append's commit, or — once the commit may have reached a peer — COMMIT_UNKNOWN
(`append_rules.decide_broken`). tests/coordinator/test_append_lane.py drives both paths
over the same appends and compares what they write, propose and answer.
"""

from __future__ import annotations

import hashlib
from typing import Any

from protocol import AppendChunk, AppendCommit, AppendRequest, AppendResponse, Fragment, Status
from protocol.spec import SuspendLevel
from protocol.stream import FrameStream
from protocol.wire import encode_frame

from .append_rules import Decision, decide_broken
from .pipeline import Pipeline, PipelineBroken
from .replica import Replica

__all__ = ["Lane", "answer", "finish", "ok_header", "try_lane"]

_CHUNK = (AppendChunk.KIND, encode_frame(AppendChunk())[0][9:])
_COMMIT = (AppendCommit.KIND, encode_frame(AppendCommit())[0][9:])
"""(kind, header bytes) of the frames a client streams an append's content with."""


class Lane:
    """One append taken by the lane: its ticket and what its answer needs."""

    __slots__ = ("res", "replica", "pipeline", "ticket", "commit", "registers", "chunks", "error",
                 "known")

    def __init__(self, res: Any, replica: Replica, pipeline: Pipeline, chunks: int,
                 known: int = 0) -> None:
        self.res = res
        self.replica = replica
        self.pipeline = pipeline
        self.chunks = chunks
        self.known = known
        """The client's route revision (AppendRequest.route_revision)."""
        self.ticket: Any = None
        self.commit: Fragment | None = None
        self.registers = None
        self.error: Decision | None = None


def ok_header(header: Any, known: int) -> Any:
    """An OK answer's header: none when the client's route came from a header of this
    same revision (AppendRequest.route_revision), which it would only repeat."""
    return None if known and header.etcd.revision == known else header


def _plain(req: AppendRequest) -> bool:
    return (req.header is None and not req.offset and not req.producer
            and req.check_registers is None and req.union_registers is None
            and req.subtract_registers is None and req.suspend == "resume")


def _route_holds(res: Any, pln: Pipeline) -> bool:
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
    pln = replica.pipeline
    if res is None or pln is None or pln.broken is not None or not pln.synced \
            or ks.changed_revision > res.header.etcd.revision:
        return None
    lock = replica.pipeline_lock
    if lock.locked() or getattr(lock, "_waiters", None):
        return None  # an append holds or awaits the pipeline: queue behind it (FSM)
    lane_of = replica.lane
    if lane_of is None or lane_of[0] is not res or lane_of[1] is not pln:
        if not _route_holds(res, pln):
            return None
        replica.lane = (res, pln)
    spool = replica.spool
    if spool.delta or (not replica.index_ready and broker.index_expected) \
            or res.spec.suspend.offset > spool.end or replica.index_end > spool.end \
            or not pln.writable():
        return None  # VALIDATE_PRECONDITIONS has work (or a peer must drain): FSM
    chunks = conn.take_run(_CHUNK, _COMMIT)
    if chunks is None:
        return None  # not all here yet (or not a plain chunk run): FSM
    return _stream(req, res, replica, pln, chunks)


def _stream(req: AppendRequest, res: Any, replica: Replica, pln: Pipeline,
            chunks: list[bytes]) -> Lane:
    """STREAM_CONTENT with every chunk and the commit at hand, then the ticket."""
    lane = Lane(res, replica, pln, len(chunks), req.route_revision)
    spool = replica.spool
    commit_sent = False
    try:
        frag = res.spec.fragment
        if spool.should_roll(frag.length, frag.compression_codec, frag.flush_interval):
            pln.send_proposal(spool.roll_proposal(codec=frag.compression_codec, acknowledge=False))
        begin = spool.end
        summer = hashlib.sha1()
        for chunk in chunks:
            pln.send_content(chunk)
            summer.update(chunk)
        prop = spool.commit_proposal()
        # From here a peer may adopt the commit: a failure is COMMIT_UNKNOWN (a pipeline
        # already broken sends nothing, so that stays definite).
        commit_sent = pln.broken is None
        local = pln.send_proposal(prop)
        if local.status != Status.OK:
            raise PipelineBroken(f"local spool refused its own proposal: {local.status.name}")
        lane.commit = Fragment(journal=req.journal, begin=begin, end=spool.end,
                               sum=summer.hexdigest(), codec=spool.fragment.codec)
        lane.registers = spool.registers
        lane.ticket = pln.ticket(must_ok=True)
    except PipelineBroken as exc:
        lane.error = decide_broken(commit_sent, str(exc))
    except BaseException:
        # As the FSM's run_to leaves mid-stream: our bytes never ride with the next commit.
        if pln.broken is None and spool.delta:
            try:
                pln.send_proposal(spool.rollback_proposal(acknowledge=False))
            except PipelineBroken:
                pass
        raise
    return lane


def answer(lane: Lane, failure: BaseException | None = None) -> AppendResponse:
    """The append's answer once its ticket resolved (READ_ACKNOWLEDGEMENTS), or failed
    with `failure`: as the FSM gives it."""
    header = lane.res.header
    d = lane.error
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
        try:
            if not lane.pipeline.writable():
                await lane.pipeline.drain()  # as the FSM's hand-off
            await lane.ticket
        except Exception as exc:  # noqa: BLE001 - the FSM's READ_ACKNOWLEDGEMENTS
            failure = exc
    return answer(lane, failure)
