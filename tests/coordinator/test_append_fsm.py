"""The append FSM: every state handled, every transition produced by a pure decision."""

from __future__ import annotations

from quire.protocol import (
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
