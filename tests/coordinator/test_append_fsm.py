"""The append FSM: every state handled, every transition produced by a pure decision."""

from __future__ import annotations

from protocol import (
    AppendRequest,
    Etcd,
    Flag,
    Fragment,
    Header,
    JournalSpec,
    LabelSelector,
    LabelSet,
    ProcessId,
    ReplicateResponse,
    Route,
    Status,
    Suspend,
    SuspendLevel,
)
from coordinator.append_fsm import AppendFSM, State
from coordinator.append_rules import (
    TRANSITIONS,
    decide_acquired,
    decide_assignments,
    decide_replicas,
    decide_resolve,
    decide_start,
    decide_sync,
    next_registers,
    validate_preconditions,
)

J = "fsm/journal"
A, B, C = ProcessId("z", "aaaa"), ProcessId("z", "bbbb"), ProcessId("z", "cccc")
ROUTE = Route(members=(A, B, C), primary=0, endpoints=("h:1", "h:2", "h:3"))
OURS = Fragment(journal=J, begin=0, end=100, sum="1" * 40)
SPEC = JournalSpec(name=J, replication=3)

seen: set[tuple[State, State]] = set()


def edge(src: State, d) -> State:  # noqa: ANN001
    assert d.state in TRANSITIONS[src], (src, d)
    seen.add((src, d.state))
    return d.state


def test_every_state_has_a_handler() -> None:
    assert set(TRANSITIONS) == set(State)
    for s in State:
        assert callable(getattr(AppendFSM, "_on_" + s.name.lower()))
    assert [s.name for s in State] == [
        "RESOLVE", "ACQUIRE_PIPELINE", "START_PIPELINE", "SEND_PIPELINE_SYNC", "RECV_PIPELINE_SYNC",
        "UPDATE_ASSIGNMENTS", "AWAIT_DESIRED_REPLICAS", "VALIDATE_PRECONDITIONS", "STREAM_CONTENT",
        "READ_ACKNOWLEDGEMENTS", "ERROR", "PROXY", "FINISHED"]


def test_resolve() -> None:
    assert edge(State.RESOLVE, decide_resolve(Status.OK, False, False)) is State.AWAIT_DESIRED_REPLICAS
    assert edge(State.RESOLVE, decide_resolve(Status.OK, True, True)) is State.START_PIPELINE
    assert edge(State.RESOLVE, decide_resolve(Status.OK, True, False)) is State.ACQUIRE_PIPELINE
    assert edge(State.RESOLVE, decide_resolve(Status.JOURNAL_NOT_FOUND, False, False)) is State.ERROR


def test_acquire_and_start() -> None:
    assert edge(State.ACQUIRE_PIPELINE, decide_acquired(True)) is State.START_PIPELINE
    assert edge(State.ACQUIRE_PIPELINE, decide_acquired(False)) is State.RESOLVE
    seen.add((State.ACQUIRE_PIPELINE, State.ERROR))  # lock timeout (adapter)
    assert edge(State.START_PIPELINE, decide_start(ROUTE, True, ROUTE)) is State.UPDATE_ASSIGNMENTS
    assert edge(State.START_PIPELINE, decide_start(None, False, ROUTE)) is State.SEND_PIPELINE_SYNC
    older = Route(members=(A, B), primary=0, endpoints=("h:1", "h:2"))
    assert edge(State.START_PIPELINE, decide_start(older, True, ROUTE)) is State.SEND_PIPELINE_SYNC
    assert edge(State.START_PIPELINE, decide_start(ROUTE, True, ROUTE, False)) is State.RESOLVE
    seen.add((State.START_PIPELINE, State.ERROR))  # peers unreachable (adapter)
    seen.add((State.SEND_PIPELINE_SYNC, State.RECV_PIPELINE_SYNC))
    seen.add((State.SEND_PIPELINE_SYNC, State.ERROR))


def test_recv_sync() -> None:
    ok = ReplicateResponse()
    assert edge(State.RECV_PIPELINE_SYNC, decide_sync([(B, ok), (C, ok)], OURS, ROUTE, 10)) \
        is State.UPDATE_ASSIGNMENTS
    later = Header(route=Route(members=(B, C), primary=0), etcd=Etcd(revision=20))
    d = decide_sync([(B, ReplicateResponse(status=Status.WRONG_ROUTE, header=later))], OURS, ROUTE, 10)
    assert edge(State.RECV_PIPELINE_SYNC, d) is State.RESOLVE and d.read_through == 20
    ahead = Fragment(journal=J, begin=50, end=300, sum="2" * 40)
    regs = LabelSet.of({"k": "v"})
    d = decide_sync([(B, ReplicateResponse(status=Status.PROPOSAL_MISMATCH, fragment=ahead,
                                           registers=regs))], OURS, ROUTE, 10)
    assert edge(State.RECV_PIPELINE_SYNC, d) is State.SEND_PIPELINE_SYNC
    assert d.roll_to == 300 and d.registers == regs
    empty_at_end = Fragment(journal=J, begin=100, end=100)
    d = decide_sync([(C, ReplicateResponse(status=Status.PROPOSAL_MISMATCH, fragment=empty_at_end))],
                    OURS, ROUTE, 10)
    assert d.state is State.SEND_PIPELINE_SYNC and d.roll_to == 100  # a new member forces a roll
    diverged = Fragment(journal=J, begin=0, end=100, sum="3" * 40)
    d = decide_sync([(C, ReplicateResponse(status=Status.PROPOSAL_MISMATCH, fragment=diverged))],
                    OURS, ROUTE, 10)
    assert edge(State.RECV_PIPELINE_SYNC, d) is State.ERROR


def test_update_assignments_and_replicas() -> None:
    plain = ROUTE.without_endpoints()
    assert edge(State.UPDATE_ASSIGNMENTS, decide_assignments([plain] * 3, ROUTE)) \
        is State.AWAIT_DESIRED_REPLICAS
    assert edge(State.UPDATE_ASSIGNMENTS, decide_assignments([plain, None, plain], ROUTE)) is State.RESOLVE
    seen.add((State.UPDATE_ASSIGNMENTS, State.ERROR))
    assert edge(State.AWAIT_DESIRED_REPLICAS, decide_replicas(4, 3, True, True, False)) is State.RESOLVE
    d = decide_replicas(2, 3, True, True, False)
    assert edge(State.AWAIT_DESIRED_REPLICAS, d) is State.ERROR
    assert d.status == Status.INSUFFICIENT_JOURNAL_BROKERS
    assert edge(State.AWAIT_DESIRED_REPLICAS, decide_replicas(3, 3, False, True, False)) is State.PROXY
    assert decide_replicas(3, 3, False, True, True).status == Status.NOT_JOURNAL_PRIMARY_BROKER
    assert decide_replicas(3, 3, False, False, False).status == Status.NO_JOURNAL_PRIMARY_BROKER
    assert edge(State.AWAIT_DESIRED_REPLICAS, decide_replicas(3, 3, True, True, False)) \
        is State.VALIDATE_PRECONDITIONS


def test_preconditions() -> None:
    req = AppendRequest(journal=J)
    v = State.VALIDATE_PRECONDITIONS
    assert edge(v, validate_preconditions(req, SPEC, LabelSet(), 100, 0)) is State.STREAM_CONTENT
    regs = LabelSet.of({"owner": "a"})
    d = validate_preconditions(AppendRequest(journal=J, check_registers=LabelSelector.parse("owner=b")),
                               SPEC, regs, 100, 0)
    assert edge(v, d) is State.ERROR and d.status == Status.REGISTER_MISMATCH
    # Empty registers match any selector (consistency was lost and re-established).
    assert validate_preconditions(AppendRequest(journal=J, check_registers=LabelSelector.parse("owner=b")),
                                  SPEC, LabelSet(), 100, 0).state is State.STREAM_CONTENT
    assert validate_preconditions(req, SPEC, LabelSet(), 100, 200).status == Status.INDEX_HAS_GREATER_OFFSET
    ro = JournalSpec(name=J, flags=Flag.READ_ONLY)
    assert validate_preconditions(req, ro, LabelSet(), 100, 200).state is State.STREAM_CONTENT
    assert validate_preconditions(AppendRequest(journal=J, offset=5), SPEC, LabelSet(), 100, 0).status \
        == Status.WRONG_APPEND_OFFSET
    d = validate_preconditions(AppendRequest(journal=J, offset=200), SPEC, LabelSet(), 100, 200)
    assert edge(v, d) is State.SEND_PIPELINE_SYNC and d.roll_to == 200  # reset-head
    susp = JournalSpec(name=J, suspend=Suspend(level=SuspendLevel.FULL))
    assert validate_preconditions(AppendRequest(journal=J, suspend="no-resume"), susp, LabelSet(), 0, 0) \
        .status == Status.SUSPENDED
    seen.add((v, State.RESOLVE))  # route changed while awaiting the index (adapter)
    assert next_registers(regs, AppendRequest(journal=J, union_registers=LabelSet.of({"x": "1"}),
                                              subtract_registers=LabelSet.of({"owner": ""}))) \
        == LabelSet.of({"x": "1"})


def test_streaming_edges_and_coverage() -> None:
    # STREAM_CONTENT / READ_ACKNOWLEDGEMENTS are IO-only; their edges are exercised by
    # the integration tests (commit, rollback on abort, pipeline failure).
    for src, dst in [(State.STREAM_CONTENT, State.STREAM_CONTENT),
                     (State.STREAM_CONTENT, State.READ_ACKNOWLEDGEMENTS),
                     (State.STREAM_CONTENT, State.ERROR),
                     (State.READ_ACKNOWLEDGEMENTS, State.FINISHED),
                     (State.READ_ACKNOWLEDGEMENTS, State.ERROR),
                     (State.RECV_PIPELINE_SYNC, State.ERROR)]:
        assert dst in TRANSITIONS[src]
        seen.add((src, dst))
    test_resolve()
    test_acquire_and_start()
    test_recv_sync()
    test_update_assignments_and_replicas()
    test_preconditions()
    every = {(s, d) for s, ds in TRANSITIONS.items() for d in ds}
    assert every - seen == set(), f"transitions never produced: {every - seen}"


# -- failure answers: COMMIT_UNKNOWN once the commit was sent, definite before ---------
# (reliability.md, finding 1: UNAVAILABLE after the commit made clients re-send records
# that replicas adopted at the next sync, so they landed twice.)

import asyncio  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import pytest  # noqa: E402

from coordinator.append_fsm import AppendAborted  # noqa: E402
from coordinator.append_rules import decide_broken  # noqa: E402
from coordinator.pipeline import PipelineBroken  # noqa: E402
from coordinator.replica import Replica  # noqa: E402
from coordinator.spool import MemoryFiles  # noqa: E402
from tests.coordinator.fake_pipeline import FakePipeline  # noqa: E402


def test_decide_broken_is_commit_unknown_only_after_the_commit() -> None:
    d = decide_broken(True, "peer z#bbbb reset")
    assert d.state is State.ERROR and d.status == Status.COMMIT_UNKNOWN
    assert "commit was sent" in d.message and "peer z#bbbb reset" in d.message
    d = decide_broken(False, "peer z#bbbb reset")
    assert d.state is State.ERROR and d.status == Status.UNAVAILABLE
    assert d.message == "peer z#bbbb reset"
    assert not Status.COMMIT_UNKNOWN.retriable and Status.COMMIT_UNKNOWN >= 64


class _Source:
    def __init__(self, *items: bytes | None | AppendAborted) -> None:
        self.items = list(items)

    async def next_chunk(self):  # noqa: ANN201
        item = self.items.pop(0)
        if isinstance(item, AppendAborted):
            raise item
        return item

    def throttled(self, seconds: float) -> None:
        pass


async def _stream(source: _Source, **faults) -> tuple[AppendFSM, FakePipeline, Replica]:  # noqa: ANN003
    """Run an FSM from STREAM_CONTENT on an owned, synchronized pipeline to its end."""
    replica = Replica(J, MemoryFiles())
    pln = FakePipeline(replica, **faults)
    fsm = AppendFSM(SimpleNamespace(), AppendRequest(journal=J), source)
    fsm.res = SimpleNamespace(spec=SPEC, header=Header(route=ROUTE, etcd=Etcd(revision=5)))
    fsm.replica, fsm.pipeline = replica, pln
    await replica.pipeline_lock.acquire()
    fsm.owns_pipeline = True
    fsm.state = State.STREAM_CONTENT
    await fsm.run()
    assert not replica.pipeline_lock.locked()
    return fsm, pln, replica


async def test_fsm_commits_when_every_peer_acknowledges() -> None:
    fsm, pln, replica = await _stream(_Source(b"hello ", b"world\n", None))
    assert fsm.state is State.FINISHED and fsm.commit_sent
    assert (fsm.commit.begin, fsm.commit.end) == (0, 12) and replica.head == 12


@pytest.mark.parametrize("ack_error", [
    PipelineBroken("peer z#bbbb: connection reset"),
    TimeoutError(),  # ACK_TIMEOUT in the pipeline's reader
    PipelineBroken("peer z#cccc answered PROPOSAL_MISMATCH"),
])
async def test_fsm_ack_failure_after_the_commit_is_commit_unknown(ack_error) -> None:  # noqa: ANN001
    fsm, pln, replica = await _stream(_Source(b"record\n", None), ack_error=ack_error)
    assert fsm.state is State.ERROR and fsm.status == Status.COMMIT_UNKNOWN
    assert fsm.trace[-2:] == [State.READ_ACKNOWLEDGEMENTS, State.ERROR]
    assert "commit was sent" in fsm.message
    assert pln.commits == 1  # the commit did go out
    assert replica.head == 0  # never published as committed


@pytest.mark.parametrize("break_at", ["commit", "drain"])
async def test_fsm_break_while_sending_the_commit_is_commit_unknown(break_at: str) -> None:
    fsm, _, _ = await _stream(_Source(b"record\n", None), break_at=break_at)
    assert fsm.state is State.ERROR and fsm.status == Status.COMMIT_UNKNOWN


async def test_fsm_break_before_the_commit_is_definite() -> None:
    # A peer fails on a content chunk: replicas roll the content back when the stream
    # ends, nothing can be committed: UNAVAILABLE, which the client may safely re-send.
    fsm, pln, _ = await _stream(_Source(b"part 1", b"part 2\n", None), break_at="content")
    assert fsm.state is State.ERROR and fsm.status == Status.UNAVAILABLE and not fsm.commit_sent
    assert pln.commits == 0
    # Broken after the last chunk but before the commit: the commit never leaves.
    fsm, pln, _ = await _stream(_Source(b"record\n", None), break_at="before-commit")
    assert fsm.state is State.ERROR and fsm.status == Status.UNAVAILABLE and not fsm.commit_sent
    assert pln.commits == 0


async def test_fsm_barrier_and_rollback_failures_stay_definite() -> None:
    # A zero-byte append (a transaction barrier) commits no content: nothing can land twice.
    fsm, _, _ = await _stream(_Source(None), ack_error=PipelineBroken("reset"))
    assert fsm.state is State.ERROR and fsm.status == Status.UNAVAILABLE and not fsm.commit_sent
    # A client abort sends a rollback, never a commit.
    fsm, _, _ = await _stream(_Source(b"x", AppendAborted("client aborted: bye")),
                              ack_error=PipelineBroken("reset"))
    assert fsm.state is State.ERROR and fsm.status == Status.UNAVAILABLE and not fsm.commit_sent
    fsm, _, _ = await _stream(_Source(b"x", AppendAborted("client aborted: bye")))
    assert fsm.state is State.ERROR and fsm.status == Status.ABORTED


# -- a proxying coordinator (append_api.proxy_append) ----------------------------------

from protocol import AppendChunk, AppendCommit, AppendResponse, Hello, HelloAck  # noqa: E402
from protocol.stream import FrameStream, serve_frames  # noqa: E402

from coordinator.append_api import proxy_append  # noqa: E402


class _ClientConn:
    def __init__(self) -> None:
        self.sent: list[object] = []

    async def send(self, msg, payload: bytes = b"") -> None:  # noqa: ANN001
        self.sent.append(msg)


class _ProxySource(_Source):
    done = True


async def _primary_that_dies_after_the_commit(got: list[object]):  # noqa: ANN202
    """A primary that reads the whole append, commit included, then drops the connection
    without answering (killed after it replicated the commit)."""

    async def serve(stream: FrameStream) -> None:
        assert isinstance((await stream.read()).message, Hello)
        await stream.send(HelloAck(process_id=A))
        while True:
            frame = await stream.read()
            got.append(frame.message)
            if isinstance(frame.message, AppendCommit):
                break
        stream.transport.abort()

    return await serve_frames(serve, "127.0.0.1", 0)


async def _proxy(source: _Source, endpoint: str) -> AppendResponse:
    res = SimpleNamespace(route=SimpleNamespace(primary_endpoint=endpoint),
                          header=Header(route=ROUTE, etcd=Etcd(revision=5)))
    conn = _ClientConn()
    await proxy_append(conn, AppendRequest(journal=J), res, source)
    (resp,) = conn.sent
    assert isinstance(resp, AppendResponse)
    return resp


async def test_proxy_upstream_lost_after_forwarding_the_commit_is_commit_unknown() -> None:
    got: list[object] = []
    server = await _primary_that_dies_after_the_commit(got)
    endpoint = "127.0.0.1:%d" % server.sockets[0].getsockname()[1]
    try:
        resp = await _proxy(_ProxySource(b"record\n", None), endpoint)
        assert resp.status == Status.COMMIT_UNKNOWN, resp
        assert "proxy to primary" in resp.message
        assert [type(m) for m in got][-2:] == [AppendChunk, AppendCommit]
        # A zero-byte append (a barrier) forwarded and lost commits nothing: definite.
        resp = await _proxy(_ProxySource(None), endpoint)
        assert resp.status == Status.UNAVAILABLE, resp
    finally:
        server.close()
        await server.wait_closed()


async def test_proxy_failure_before_forwarding_the_commit_is_definite() -> None:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    endpoint = "127.0.0.1:%d" % server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()  # nothing listens there now: connection refused
    resp = await _proxy(_ProxySource(b"record\n", None), endpoint)
    assert resp.status == Status.UNAVAILABLE and "proxy to primary" in resp.message


# -- exactly-once (append_eo.py) ---------------------------------------------------------

async def _identified(replica: Replica, pln: FakePipeline, txn: int, *chunks: bytes,
                      close: bool = False) -> AppendFSM:
    """Run an identified append from VALIDATE_PRECONDITIONS on an owned pipeline."""
    req = AppendRequest(journal=J, producer="w", generation=1, history=1, txn=txn,
                        close_history=close)
    return await run_owned(replica, pln, req, _Source(*chunks, None))


async def run_owned(replica: Replica, pln: FakePipeline, req: AppendRequest,
                    source: _Source) -> AppendFSM:
    """Run `req` from VALIDATE_PRECONDITIONS on an owned, synchronized pipeline."""
    fsm = AppendFSM(SimpleNamespace(), req, source)
    fsm.res = SimpleNamespace(spec=SPEC, header=Header(route=ROUTE, etcd=Etcd(revision=5)))
    fsm.replica, fsm.pipeline = replica, pln
    await replica.pipeline_lock.acquire()
    fsm.owns_pipeline = True
    fsm.state = State.VALIDATE_PRECONDITIONS
    await fsm.run()
    assert not replica.pipeline_lock.locked()
    return fsm


async def test_fsm_resent_txn_is_answered_with_the_original_commit() -> None:
    replica = Replica(J, MemoryFiles())
    pln = FakePipeline(replica)
    first = await _identified(replica, pln, 1, b"once\n")
    assert first.state is State.FINISHED and (first.commit.begin, first.commit.end) == (0, 5)
    mark = pln.peers_got[-1].mark  # the mark rode on the commit proposal
    assert (mark.txn, mark.begin, mark.end, mark.sum) == (1, 0, 5, first.commit.sum)
    again = await _identified(replica, pln, 1, b"once\n")
    assert again.state is State.FINISHED
    assert (again.commit.begin, again.commit.end, again.commit.sum) == \
        (first.commit.begin, first.commit.end, first.commit.sum)
    assert replica.spool.end == 5 and pln.commits == 1  # nothing written twice
    assert pln.peers_got[-1].proposal == replica.spool.fragment  # a barrier, no mark
    assert pln.peers_got[-1].mark is None and not again.commit_sent
    ahead = await _identified(replica, pln, 3, b"x\n")
    assert ahead.state is State.ERROR and ahead.status == Status.TXN_OUT_OF_ORDER
    closing = await _identified(replica, pln, 2, close=True)  # a zero-byte close
    assert closing.state is State.FINISHED and closing.commit_sent  # its mark is state
    closed = await _identified(replica, pln, 3, b"late\n")
    assert closed.status == Status.HISTORY_CLOSED and replica.spool.end == 5
