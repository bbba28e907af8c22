"""bench.scale: its pure parts, and a tiny real run (N = 3 and 10, a few seconds each)
that checks every figure exists, every route filled and no append failed, never sizes."""

from __future__ import annotations

import msgspec
import pytest

from bench.scale import (
    APPLY_CHUNK, assigned_journals, derive, full_routes, journal_limit, render, round_robin, run_scale,
)
from bench.scale_cluster import metric_values, raise_nofile
from chaos.cluster import coordinator_available
from protocol import ProcessId, Route

ROOT = "/quire"
A, B, C = ProcessId("zone-a", "coord-a"), ProcessId("zone-b", "coord-b"), ProcessId("zone-c", "coord-c")


def _key(journal: str, m: ProcessId, slot: int) -> str:
    return f"{ROOT}/assign/{journal}#{m.zone}#{m.suffix}#{slot}"


def _route(*members: ProcessId, primary: ProcessId) -> bytes:
    ms = tuple(sorted(members))
    return msgspec.json.encode(Route(members=ms, primary=ms.index(primary)))


def test_full_routes_needs_every_member_a_primary_and_the_route_advertised() -> None:
    good = _route(A, B, C, primary=B)
    kvs = [
        # full: three members, B primary (slot 0), all advertise the route
        (_key("j/full", B, 0), good), (_key("j/full", A, 1), good), (_key("j/full", C, 2), good),
        # not advertised yet on one member
        (_key("j/half", B, 0), good), (_key("j/half", A, 1), good), (_key("j/half", C, 2), b"{}"),
        # two of three members
        (_key("j/short", A, 0), _route(A, B, primary=A)), (_key("j/short", B, 1), _route(A, B, primary=A)),
        # no primary (no slot 0)
        (_key("j/headless", A, 1), good), (_key("j/headless", B, 2), good), (_key("j/headless", C, 3), good),
        # advertises another primary than the assignments make
        (_key("j/stale", A, 0), good), (_key("j/stale", B, 1), good), (_key("j/stale", C, 2), good),
        ("/quire/assign/not-a-key", good),
    ]
    assert full_routes(kvs, 3, ROOT) == {"j/full"}
    assert full_routes(kvs[:2], 2, ROOT) == set()  # B and A advertise a route of three
    # assigned (the allocator's part done): three assignments and a primary, advertised or not
    assert assigned_journals(kvs, 3, ROOT) == {"j/full", "j/half", "j/stale"}


def test_round_robin_visits_every_journal_in_turn() -> None:
    nxt = round_robin(["a", "b", "c"])
    assert [nxt() for _ in range(7)] == ["a", "b", "c", "a", "b", "c", "a"]


def test_journal_limit_leaves_room_for_a_failover() -> None:
    assert journal_limit(10, 3, 5) == 1024  # never below the default
    limit = journal_limit(10_000, 3, 5)
    assert limit >= 6_000 * 5 // 4  # one of five members gone: its share spread over four
    assert APPLY_CHUNK * 1 <= 128  # one upsert per spec fits etcd's default txn limit


def test_derive_per_replica_costs_and_ratios() -> None:
    run = {"empty": [{"rss_kib": 1000, "fds": 20}, {"rss_kib": 1000, "fds": 20}],
           "coordinators": [{"rss_kib": 1640, "fds": 45, "replicas": 10, "idle_cpu_pct": 2.0},
                            {"rss_kib": 1100, "fds": 30, "replicas": 0, "idle_cpu_pct": 4.0}],
           "appends_per_s": 800.0}
    out = derive(run, {"appends_per_s": 1000.0})
    assert out["rss_kib_per_replica"] == 64.0
    assert out["fds_per_replica"] == 2.5
    assert out["idle_cpu_pct_max"] == 4.0 and out["idle_cpu_pct_median"] == 3.0
    assert out["append_ratio"] == 0.8
    assert "append_ratio" not in derive(run, None)
    failed = {"journals": 10000, "error": "Unavailable(...)", "empty": run["empty"]}
    assert derive(failed, {"appends_per_s": 1000.0}) == {
        "rss_kib_per_replica": None, "fds_per_replica": None, "idle_cpu_pct_max": None,
        "idle_cpu_pct_median": None}
    table = render({"runs": [{**run, "journals": 10, **out}, failed]})
    assert "N=10000: Unavailable(...)" in table
    died = {**run, "journals": 1000, "coordinators": [
        run["coordinators"][0], {"exited": -9, "log_tail": "", "idle_cpu_pct": 0.0}]}
    assert derive(died, None)["rss_kib_per_replica"] == 64.0
    assert "N=1000: coordinator 1 exited (-9)" in render({"runs": [died]})


def test_metric_values_reads_unlabelled_samples() -> None:
    text = ("# HELP quire_asyncio_tasks x\n# TYPE quire_asyncio_tasks gauge\n"
            "quire_asyncio_tasks 42.0\nquire_replicas 7.0\nquire_appends_total{status=\"OK\"} 3.0\n")
    assert metric_values(text, ("quire_asyncio_tasks", "quire_replicas")) == {
        "quire_asyncio_tasks": 42.0, "quire_replicas": 7.0}


def test_raise_nofile_reaches_the_hard_limit() -> None:
    import resource

    soft, hard = raise_nofile()
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (soft, hard)
    assert hard == resource.RLIM_INFINITY or soft == hard


@pytest.mark.timeout(300)
@pytest.mark.skipif(not coordinator_available(), reason="coordinator.main is not present yet")
def test_smoke_three_and_ten_journals(tmp_path) -> None:  # noqa: ANN001
    result = run_scale([3, 10], tmp_path, settle=0.5, idle=2.0, append_s=1.0,
                       say=lambda _m: None)
    runs = result["runs"]
    assert [r["journals"] for r in runs] == [3, 10]
    for r in runs:
        assert r["full_routes"] == r["journals"] and r["full_s"] is not None, r
        assert r["append_errors"] == 0 and r["appends"] > 0, r
        assert len(r["coordinators"]) == 5
        assert sum(c["replicas"] for c in r["coordinators"]) == 3 * r["journals"]
        assert all(c["tasks"] > 0 and c["fds"] > 0 and c["rss_kib"] > 0 for c in r["coordinators"])
        assert r["etcd_keys"] > r["journals"] and r["etcd_db_bytes"] > 0
        assert r["stop_s"] >= 0
        assert r["errors_logged"] == {f"coordinator-{i}": 0 for i in range(5)}, r["errors_logged"]
        # The window's decomposition: the lane's group commit and who spent the CPU.
        assert r["appends_per_commit"] is not None and r["appends_per_commit"] >= 1.0, r
        cpu = r["append_cpu_us"]
        assert cpu["client"] > 0 and cpu["coordinators"] > 0, cpu
        assert cpu["all"] >= cpu["client"] + cpu["coordinators"] - 0.2, cpu
    assert runs[1]["append_ratio"] > 0
    table = render(result)
    assert "appends/s" in table and len(table.splitlines()) == 3 + 2  # + the CPU split per N
    assert "N=10: CPU per append (µs): client " in table
    assert all(r["first_appends"] == r["journals"] and r["first_appends_per_s"] > 0 for r in runs)


def test_failover_finds_primaries_and_counts_lost_records() -> None:
    from bench.scale_failover import lost_records, primaries, record

    kvs = [(_key("j/1", B, 0), b"{}"), (_key("j/1", A, 1), b"{}"), (_key("j/2", A, 0), b"{}"),
           ("/quire/assign/not-a-key", b"{}")]
    assert primaries(kvs, ROOT) == ({"j/1": "coord-b", "j/2": "coord-a"},
                                    {"coord-a": 2, "coord-b": 1})
    content = {"j/1": record("j/1", 1) + record("j/1", 2) + record("j/1", 2),
               "j/2": record("j/2", 1)}
    assert lost_records({"j/1": [1, 2], "j/2": [1]}, content) == 0  # duplicates are fine
    assert lost_records({"j/1": [1, 3], "j/2": [2], "j/3": [1]}, content) == 3
    assert len(record("j/1", 7)) == 128


@pytest.mark.timeout(300)
@pytest.mark.skipif(not coordinator_available(), reason="coordinator.main is not present yet")
def test_smoke_failover_of_ten_journals(tmp_path) -> None:  # noqa: ANN001
    result = run_scale([10], tmp_path, settle=0.5, idle=1.0, append_s=1.0, failover=True,
                       lease_ttl=5.0, say=lambda _m: None)
    fo = result["runs"][0]["failover"]
    assert fo["full_s"] is not None and fo["primary_s"] is not None, fo
    assert fo["lost"] == 0 and fo["read_errors"] == 0 and fo["acked"] > 0, fo
    done, total = map(int, fo["resumed"].split("/"))
    assert done == total > 0, fo
    assert "kill -9 of" in render(result)
    # The survivors logged no error: the victim's replicate connections ended as they should.
    errors = result["runs"][0]["errors_logged"]
    assert len(errors) == 4 and not any(errors.values()), errors
