"""Applies larger than one etcd transaction (issue #49): the planner and chunker
(protocol/apply_chunks.py), and shard/job specs applied straight to a real etcd
(topology/spec_apply.py) — 1,000 in one apply, the same file twice, a chunk whose
revision guard fails part-way and the re-run that finishes it, and an etcd with small
limits (its --max-txn-ops / --max-request-bytes) refusing with the typed limit error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import aetcd
import msgspec
import pytest

from protocol import LabelSet
from protocol.apply_chunks import ApplyIncomplete, Edit, chunk, plan, run_chunks
from protocol.errors import EtcdLimitExceeded, EtcdTransactionFailed
from protocol.job import JobSpec
from protocol.shard import ShardSource, ShardSpec
from topology.etcd import connect, put_op, txn
from topology.jobs import apply_jobs, list_jobs
from topology.shards import ShardChange, apply_shards, list_shards, shard_key
from tools.services import EtcdService

N = 1000


def shard(i: int, **kw: object) -> ShardSpec:
    base: dict[str, object] = {"id": f"scale-{i:04d}",
                               "sources": (ShardSource(journal=f"scale/part-{i:04d}"),)}
    base.update(kw)
    return ShardSpec(**base)  # type: ignore[arg-type]


# -- the pure planner and chunker ---------------------------------------------------------

def test_plan_skips_equal_specs_and_pins_the_rest_to_what_was_read() -> None:
    edits = [Edit("a", 1), Edit("b", 2), Edit("c", 3), Edit("d", None), Edit("e", None),
             Edit("f", 6, expect=9)]
    got = plan(edits, {"a": (1, 10), "b": (20, 11), "d": (4, 12), "f": (7, 13)})
    assert got.unchanged == ("a", "e")  # equal; a delete of what is absent
    assert [(e.name, e.expect) for e in got.pending] == [("b", 11), ("c", 0), ("d", 12), ("f", 9)]


def test_chunks_fit_both_limits() -> None:
    edits = [Edit(f"k{i:03d}", i, size=100) for i in range(300)]
    assert [len(c) for c in chunk(edits, 128)] == [128, 128, 44]
    by_bytes = chunk(edits, 128, max_bytes=1000)  # 100 + 2*4 + 32 = 140 bytes each
    assert {len(c) for c in by_bytes[:-1]} == {7} and sum(map(len, by_bytes)) == 300
    # An edit bigger than the budget is a chunk of its own (etcd then judges it).
    assert [len(c) for c in chunk([Edit("big", 0, size=5000), Edit("x", 1)], 10, 1000)] == [1, 1]


async def test_run_chunks_names_what_was_and_was_not_applied() -> None:
    chunks = chunk([Edit(f"k{i}", i) for i in range(10)], 4)
    written: list[list[str]] = []

    async def write(part):  # noqa: ANN001, ANN202
        if len(written) == 1:
            raise EtcdTransactionFailed("k5 changed")
        written.append([e.name for e in part])
        return 100 + len(written)

    with pytest.raises(ApplyIncomplete) as info:
        await run_chunks(chunks, write, unchanged=["z"], what="thing")
    exc = info.value
    assert exc.applied == ("k0", "k1", "k2", "k3")
    assert exc.not_applied == ("k4", "k5", "k6", "k7", "k8", "k9")
    assert exc.unchanged == ("z",) and exc.revision == 101 and exc.chunk_index == 1
    assert isinstance(exc.cause, EtcdTransactionFailed) and exc.status == exc.cause.status
    assert "applied 4 of 10 thing changes" in str(exc) and "6 not applied" in str(exc)


# -- shard specs against the session etcd -------------------------------------------------

async def test_a_thousand_shards_in_one_apply_then_unchanged(client: aetcd.Client,
                                                             etcd_root: str) -> None:
    changes = [ShardChange(spec=shard(i)) for i in range(N)]
    first = await apply_shards(client, etcd_root, changes)
    assert len(first.applied) == N and first.transactions == 8 and not first.unchanged
    assert len(await list_shards(client, etcd_root)) == N
    again = await apply_shards(client, etcd_root, changes)
    assert again.applied == () and len(again.unchanged) == N and again.transactions == 0
    # Nothing was written the second time: every key keeps its revision.
    assert again.revision >= first.revision
    assert max(e.mod_revision for e in await list_shards(client, etcd_root)) == first.revision


async def test_a_chunk_whose_guard_fails_stops_the_apply_and_a_rerun_finishes(
        client: aetcd.Client, etcd_root: str) -> None:
    changes = [ShardChange(spec=shard(i)) for i in range(300)]  # chunks of 100
    victim = shard(250, hot_standbys=1)  # read (absent) before chunk 1; chunk 3 writes it

    async def concurrent_writer(index, _result):  # noqa: ANN001, ANN202
        if index == 0:  # after chunk 1 committed, another editor creates scale-0250
            await txn(client, [], [put_op(shard_key(etcd_root, victim.id),
                                          msgspec.json.encode(victim))])

    with pytest.raises(ApplyIncomplete) as info:
        await apply_shards(client, etcd_root, changes, max_txn_size=100,
                           progress=concurrent_writer)
    exc = info.value
    assert exc.applied == tuple(f"scale-{i:04d}" for i in range(200))
    assert exc.not_applied == tuple(f"scale-{i:04d}" for i in range(200, 300))
    assert isinstance(exc.cause, EtcdTransactionFailed) and "scale-0250" in str(exc.cause)
    stored = {e.spec.id: e.spec for e in await list_shards(client, etcd_root)}
    assert len(stored) == 201 and stored[victim.id] == victim  # chunk 3 wrote nothing
    rerun = await apply_shards(client, etcd_root, changes, max_txn_size=100)
    assert len(rerun.unchanged) == 200 and len(rerun.applied) == 100
    assert {e.spec.id: e.spec for e in await list_shards(client, etcd_root)} == \
        {c.spec.id: c.spec for c in changes if c.spec is not None}


async def test_jobs_apply_skips_unchanged(client: aetcd.Client, etcd_root: str) -> None:
    specs = [JobSpec.from_obj({"name": f"scale/j{i}", "selector": "topic=x", "window": "1m",
                               "target": {"kind": "celery", "name": "workers.jobs.noop"},
                               "start": 0}) for i in range(3)]
    first = await apply_jobs(client, etcd_root, specs, max_txn_size=2)
    assert len(first.applied) == 3 and first.transactions == 2
    again = await apply_jobs(client, etcd_root, specs, max_txn_size=2)
    assert again.applied == () and len(again.unchanged) == 3
    assert [s for s, _ in await list_jobs(client, etcd_root)] == specs


# -- an etcd with small limits ------------------------------------------------------------

@pytest.fixture(scope="module")
def small_etcd(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    with EtcdService("etcd-small-limits", workdir=tmp_path_factory.mktemp("etcd-small"),
                     extra_args=("--max-txn-ops", "16", "--max-request-bytes", "16384")) as svc:
        yield svc


async def test_an_etcd_limit_is_a_typed_error_and_chunking_fits_it(small_etcd: EtcdService,
                                                                   tmp_path: Path) -> None:
    client = await connect(small_etcd.url)
    try:
        root = "/small-ops"
        changes = [ShardChange(spec=shard(i)) for i in range(40)]
        with pytest.raises(ApplyIncomplete) as info:  # 128 per chunk: over --max-txn-ops 16
            await apply_shards(client, root, changes + [ShardChange(spec=shard(i))
                                                         for i in range(40, 200)])
        cause = info.value.cause
        assert isinstance(cause, EtcdLimitExceeded), cause
        assert "--max-txn-ops" in str(cause) and "--max-txn-size" in str(cause)
        assert info.value.applied == ()
        # One chunk: the limit error itself, not UNAVAILABLE.
        with pytest.raises(EtcdLimitExceeded, match="too many operations"):
            await apply_shards(client, root, changes)
        fitted = await apply_shards(client, root, changes, max_txn_size=16)
        assert len(fitted.applied) == 40 and fitted.transactions == 3
        # Request bytes: 16 specs of ~2 KiB labels each are over 16 KiB.
        fat = [ShardChange(spec=shard(i, labels=LabelSet.of(aa="x" * 1000, bb="y" * 1000)))
               for i in range(16)]
        with pytest.raises(EtcdLimitExceeded, match="--max-request-bytes"):
            await apply_shards(client, "/small-bytes", fat, max_txn_size=16)
        fitted = await apply_shards(client, "/small-bytes", fat, max_txn_size=4)
        assert len(fitted.applied) == 16
    finally:
        await client.close()


async def test_a_guarded_journal_apply_of_128_fits_one_transaction(client: aetcd.Client,
                                                                   etcd_root: str) -> None:
    """With auth on, a coordinator pins each journal to the revision its guard read: one
    compare per journal, so a chunk of 128 stays within etcd's 128 (it was 256)."""
    from coordinator.specs import apply_specs
    from protocol import ApplyChange, JournalSpec

    seen: list[int] = []
    changes = [ApplyChange(upsert=JournalSpec(name=f"guarded/j{i:03d}"), expect_mod_revision=0)
               for i in range(128)]
    rev = await apply_specs(client, etcd_root, changes, guard=lambda items: seen.append(len(items)))
    assert rev > 0 and seen == [128]
    stale = [ApplyChange(upsert=JournalSpec(name="guarded/j000", replication=2),
                         expect_mod_revision=rev - 1)]
    with pytest.raises(EtcdTransactionFailed, match="guarded/j000"):
        await apply_specs(client, etcd_root, stale, guard=lambda items: None)


def _cli(etcd: EtcdService, root: str, *args: str, stdin: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "QUIRE_ETCD_URL": etcd.url, "QUIRE_ETCD_ROOT": root, "COLUMNS": "250"}
    return subprocess.run([sys.executable, "-m", "tools.cli.main", *args, "-f", "-"], input=stdin,
                          capture_output=True, text=True, env=env, timeout=60)


def test_shards_and_jobs_apply_commands_chunk_and_say_unchanged(etcd: EtcdService,
                                                                 etcd_root: str) -> None:
    shards = "shards:\n" + "".join(f"  - {{id: cli-{i}, sources: [{{journal: aa/p{i}}}]}}\n"
                                   for i in range(5))
    first = _cli(etcd, etcd_root, "shards", "apply", "--max-txn-size", "2", stdin=shards)
    assert first.returncode == 0, first.stderr
    assert "applied 5 shard change(s) in 3 transaction(s)" in first.stdout, first.stdout
    again = _cli(etcd, etcd_root, "shards", "apply", stdin=shards)
    assert "applied 0 shard change(s), 5 unchanged" in again.stdout, again.stdout
    job = ("name: cli/j\nselector: topic=x\nwindow: 1m\nstart: 0\n"
           "target: {kind: celery, name: workers.jobs.noop}\n")
    first = _cli(etcd, etcd_root, "jobs", "apply", stdin=job)
    assert first.returncode == 0 and "applied 1 job change(s)" in first.stdout, first.stderr
    again = _cli(etcd, etcd_root, "jobs", "apply", stdin=job)
    assert "applied 0 job change(s), 1 unchanged" in again.stdout, again.stdout
