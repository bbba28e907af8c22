"""Thousands of journals (issue #49): one spec file applied with `quire journals apply`
to a small cluster of coordinators, chunked into etcd-sized transactions; the same file
again changes nothing; every route fills; after a `kill -9` of one coordinator every
route fills again — 1,000 journals, in `make test` (~25–35 s here).

Also, through the client library: a chunked apply whose later chunk's revision guard
fails (a concurrent editor) names what was and was not applied, and a re-run finishes.
Waits are bounded and named; times are printed (`-s`), never asserted.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from protocol import ApplyChange, JournalSpec, LabelSet
from protocol.apply_chunks import ApplyIncomplete
from protocol.errors import EtcdTransactionFailed
from quire.client import Client
from tests.coordinator.cluster import Cluster, running
from topology.etcd import assign_prefix, connect, journal_key, parse_assignment_key, put_op, txn

pytestmark = pytest.mark.timeout(300)

REPLICATION = 2
COORDINATORS = 3
TTL = 10


def spec_file(path: Path, prefix: str, n: int) -> Path:
    children = "".join(f"  - name: {prefix}part-{i:04d}\n" for i in range(n))
    path.write_text(f"name: {prefix}\nreplication: {REPLICATION}\nlabels: {{topic: scale}}\n"
                    "fragment: {length: 1MiB, compression_codec: none, refresh_interval: 1m,"
                    " flush_interval: 1h}\n"
                    f"children:\n{children}")
    return path


def quire(broker: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "QUIRE_BROKER": broker}
    return subprocess.run([sys.executable, "-m", "tools.cli.main", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


async def routes_full(etcd_url: str, root: str, prefix: str, n: int,
                      dead: str | None = None) -> tuple[bool, str]:
    """Whether each of the `n` journals under `prefix` has REPLICATION assignments, one
    primary, none on `dead`, and every assignment holds the advertised route (the
    primary synced the pipeline); with a count of what is not yet so."""
    client = await connect(etcd_url)
    try:
        kvs = (await client.get_prefix(assign_prefix(root).encode())).kvs
    finally:
        await client.close()
    by: dict[str, list[tuple[str, int, bytes]]] = {}
    for kv in kvs:
        journal, pid, slot = parse_assignment_key(root, kv.key.decode())
        if journal.startswith(prefix):
            by.setdefault(journal, []).append((pid.suffix, slot, kv.value))
    short = sum(1 for j in by.values() if len(j) != REPLICATION) + (n - len(by))
    unsynced = on_dead = 0
    for items in by.values():
        values = {v for _, _, v in items}
        if len(values) != 1 or values == {b"{}"} or sum(1 for _, s, _ in items if s == 0) != 1:
            unsynced += 1
        if any(m == dead for m, _, _ in items):
            on_dead += 1
    ok = short == 0 and unsynced == 0 and on_dead == 0
    return ok, f"{short} short, {unsynced} not advertised, {on_dead} on {dead}"


async def wait_full(etcd_url: str, root: str, prefix: str, n: int, timeout: float, what: str,
                    dead: str | None = None) -> float:
    start = time.monotonic()
    state = ""
    while time.monotonic() - start < timeout:
        ok, state = await routes_full(etcd_url, root, prefix, n, dead)
        if ok:
            return time.monotonic() - start
        await asyncio.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}: {state}")


def scale_run(etcd, etcd_root: str, tmp_path: Path, n: int, timeout: float) -> None:  # noqa: ANN001
    # As an operator would for n journals: room for all of them on the members left after
    # one is lost, and a lease TTL (10 s; 20 s by default) a busy host refreshes in time.
    extra = ["--journal-limit", str(n * REPLICATION), "--lease-ttl", str(TTL)]
    with running(etcd.url, etcd_root, COORDINATORS, extra, prefix="scale") as cluster:
        asyncio.run(_scale(cluster, etcd.url, etcd_root, tmp_path, n, timeout))


async def _scale(cluster: Cluster, etcd_url: str, root: str, tmp_path: Path, n: int,
                 timeout: float) -> None:
    for node in cluster.nodes:
        await cluster.wait_listening(node)
    broker = ",".join(node.endpoint for node in cluster.nodes)
    specs = spec_file(tmp_path / "scale.yaml", "scale/", n)
    t0 = time.monotonic()
    first = quire(broker, "journals", "apply", "-f", str(specs), "-o", "json")
    t_applied = time.monotonic()
    t_apply = t_applied - t0
    assert first.returncode == 0, first.stderr
    rows = [json.loads(line) for line in first.stdout.splitlines()]
    assert len(rows) == n and {r["result"] for r in rows} == {"applied"}, first.stdout[-500:]
    again = quire(broker, "journals", "apply", "-f", str(specs))
    assert again.returncode == 0, again.stderr
    assert f"applied 0, unchanged {n}" in again.stdout, again.stdout[-500:]
    listed = quire(broker, "journals", "list", "-l", "topic=scale", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    names = [json.loads(line)["spec"]["name"] for line in listed.stdout.splitlines()]
    assert names == [f"scale/part-{i:04d}" for i in range(n)], listed.stdout[-500:]
    await wait_full(etcd_url, root, "scale/", n, timeout, f"every route of {n} journals full")
    t_full = time.monotonic() - t_applied
    # A listing primes the client's route cache: appends go straight to each primary.
    by_suffix = {node.suffix: node.endpoint for node in cluster.nodes}
    async with Client([node.endpoint for node in cluster.nodes]) as client:
        entries = await client.list_journals("topic=scale")
        assert len(entries) == n
        for e in entries:
            primary = e.route.members[e.route.primary]
            assert client.routes.primary(e.spec.name) == by_suffix[primary.suffix], e
    victim = cluster.nodes[0]
    cluster.kill(victim, signal.SIGKILL)
    t_refull = await wait_full(etcd_url, root, "scale/", n, timeout,
                               f"every route of {n} journals full again after kill -9 of "
                               f"{victim.suffix}", dead=victim.suffix)
    print(f"\n{n} journals, {COORDINATORS} coordinators, R={REPLICATION}: apply {t_apply:.1f}s, "
          f"routes full {t_full:.1f}s after it, full again after kill -9 {t_refull:.1f}s "
          f"(load {os.getloadavg()[0]:.1f})")


@pytest.mark.timeout(300)
def test_a_thousand_journals_apply_fill_and_refill(etcd, etcd_root: str, tmp_path: Path) -> None:  # noqa: ANN001
    scale_run(etcd, etcd_root, tmp_path, 1000, timeout=150)


# -- an interrupted chunked apply through the client library ------------------------------

def journal(i: int, **labels: str) -> JournalSpec:
    return JournalSpec(name=f"chunks/part-{i:03d}", replication=1,
                       labels=LabelSet.of({"topic": "chunks", **labels}))


def test_an_interrupted_journal_apply_names_both_sides_and_a_rerun_finishes(
        etcd, etcd_root: str) -> None:  # noqa: ANN001
    with running(etcd.url, etcd_root, 1, prefix="chunks") as cluster:
        asyncio.run(_interrupted(cluster, etcd.url, etcd_root))


async def _interrupted(cluster: Cluster, etcd_url: str, root: str) -> None:
    await cluster.wait_listening(cluster.nodes[0])
    wanted = [journal(i) for i in range(30)]
    victim = journal(25, tier="edited")  # read before chunk 1; chunk 3 writes it
    etcd = await connect(etcd_url)
    client = Client([cluster.nodes[0].endpoint], retry_timeout=30.0)
    try:
        async def concurrent_editor(index, _result):  # noqa: ANN001, ANN202
            if index == 0:
                await txn(etcd, [], [put_op(journal_key(root, victim.name),
                                            msgspec.json.encode(victim))])

        with pytest.raises(ApplyIncomplete) as info:
            await client.apply_chunked(wanted, max_txn_size=10, progress=concurrent_editor)
        exc = info.value
        assert exc.applied == tuple(s.name for s in wanted[:20])
        assert exc.not_applied == tuple(s.name for s in wanted[20:])
        assert isinstance(exc.cause, EtcdTransactionFailed), exc.cause
        listed = {e.spec.name: e.spec for e in await client.list_journals("topic=chunks")}
        assert len(listed) == 21 and listed[victim.name] == victim
        rerun = await client.apply_chunked(wanted, max_txn_size=10)
        assert len(rerun.unchanged) == 20 and len(rerun.applied) == 10
        listed = {e.spec.name: e.spec for e in await client.list_journals("topic=chunks")}
        assert listed == {s.name: s for s in wanted}
        # More changes than one transaction through plain `apply` are chunked too.
        more = [ApplyChange(upsert=journal(i, tier="more"), expect_mod_revision=-1)
                for i in range(30)]
        assert await client.apply(more, max_txn_size=8) > 0
        assert all(e.spec.labels.as_dict().get("tier") == ["more"]
                   for e in await client.list_journals("topic=chunks"))
    finally:
        await client.close()
        await etcd.close()


# -- an etcd with a small --max-txn-ops, through a coordinator ----------------------------

def test_an_etcd_limit_reaches_the_cli_as_itself_and_a_smaller_txn_size_fits(
        tmp_path: Path) -> None:
    from tools.services import EtcdService

    with EtcdService("etcd-small-ops", workdir=tmp_path / "etcd",
                     extra_args=("--max-txn-ops", "16")) as etcd:
        with running(etcd.url, "/small", 1, prefix="small") as cluster:
            asyncio.run(cluster.wait_listening(cluster.nodes[0]))
            specs = spec_file(tmp_path / "small.yaml", "small/", 40)
            broker = cluster.nodes[0].endpoint
            refused = quire(broker, "journals", "apply", "-f", str(specs))
            err = refused.stderr.strip()
            assert refused.returncode == 7 and len(err.splitlines()) == 1, err
            assert "ETCD_LIMIT_EXCEEDED" in err and "--max-txn-ops" in err, err
            assert "--max-txn-size" in err and "UNAVAILABLE" not in err, err
            fitted = quire(broker, "journals", "apply", "-f", str(specs), "--max-txn-size", "16")
            assert fitted.returncode == 0, fitted.stderr
            assert "applied 40, unchanged 0" in fitted.stdout, fitted.stdout[-300:]
