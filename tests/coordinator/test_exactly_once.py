"""Exactly-once appends on real clusters (issue 17, docs/exactly-once.md).

(1) a response dropped by a proxy between client and primary: re-sent, lands once;
(2) kill -9 of a primary under 10 identified writers: every txn exactly once;
(3) the same after every replica restarts from its spool directory;
(4) old-generation and closed-history appends refused with clear statuses.

QUIRE_EO_FULL=1 runs (2) at the issue's size (10 writers x 2,000 appends).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from chaos.proxy import Fault, FaultMode, FaultProxy
from protocol import Status
from protocol.errors import HistoryClosed, ProducerGenerationRetired, TxnOutOfOrder
from quire.client import AppendService, Client, Producer, TxnId

from .cluster import Cluster, Conn, running, spec, wait_appendable

pytestmark = pytest.mark.timeout(240)

FULL = bool(os.environ.get("QUIRE_EO_FULL"))


@pytest.fixture
def cluster3(etcd, etcd_root):  # noqa: ANN001, ANN201
    with running(etcd.url, etcd_root, 3, ["--drain-timeout", "20"]) as c:
        yield c


@pytest.fixture
def cluster4(etcd, etcd_root):  # noqa: ANN001, ANN201
    with running(etcd.url, etcd_root, 4, ["--drain-timeout", "20"]) as c:
        yield c


async def _setup(c: Cluster, journals: list[str]) -> None:
    for n in c.nodes:
        await c.wait_listening(n)
    conn = await Conn.open(c.nodes[0].endpoint)
    assert (await conn.apply(*[spec(j, length=64 << 20) for j in journals])).status == Status.OK
    await conn.close()
    for j in journals:
        assert (await wait_appendable(c.nodes[0].endpoint, j)).status == Status.OK


async def _primary(c: Cluster, journal: str):  # noqa: ANN202
    conn = await Conn.open(c.nodes[0].endpoint)
    listing = await conn.list()
    await conn.close()
    route = next(e.route for e in listing.journals if e.spec.name == journal)
    pid = route.members[route.primary]
    return next(n for n in c.nodes if n.suffix == pid.suffix)


def _record(name: str, txn: int) -> bytes:
    tag = f"<{name}:{txn}>".encode()
    return tag * (1 + 200 // len(tag)) + b"\n"


async def _read(endpoint: str, journal: str, end: int, timeout: float = 30.0) -> bytes:
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = await Conn.open(endpoint)
            try:
                data, _ = await conn.read(journal, 0, end_offset=end, block=True)
            finally:
                await conn.close()
            if len(data) >= end:
                return data
        except Exception:  # noqa: BLE001 - routes settling after a kill or restart
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            return data
        await asyncio.sleep(0.1)  # re-read while the route settles


def _txns(data: bytes) -> Counter:
    """(producer, txn) -> how many times its record is in the journal."""
    seen: Counter = Counter()
    for line in data.split(b"\n"):
        if line:
            name, txn = line[1:line.index(b">")].decode().split(":")
            seen[(name, int(txn))] += 1
    return seen


async def _writer(endpoints: list[str], name: str, journal: str, count: int, state_dir: str,
                  acked: dict, history=None) -> None:  # noqa: ANN001
    if history is None:
        history = Producer.start(name, state_dir).history()
    async with Client(endpoints, rpc_timeout=5.0, retry_timeout=90.0) as client:
        for _ in range(count):
            txn = history.next()
            r = await client.append(journal, _record(name, txn.txn), txn=txn)
            acked[(name, txn.txn)] = (journal, r.begin, r.end)
    return history


async def _check_exactly_once(c: Cluster, journals: list[str], acked: dict,
                              expected: dict[str, int]) -> None:
    live = [n for n in c.nodes if n.proc.poll() is None]
    for j in journals:
        end = max(e for jj, _, e in acked.values() if jj == j)
        # Fragments are never rolled here (no store): a member the allocator added after
        # a kill holds only what was written since, so read from a node that has it all.
        for n in live:
            data = await _read(n.endpoint, j, end)
            if len(data) == end and data.startswith(b"<"):
                break
        assert len(data) == end, (j, len(data), end, data[:80])
        seen = _txns(data[:end])
        dups = {k: v for k, v in seen.items() if v > 1}
        assert not dups, f"duplicates in {j}: {sorted(dups)[:10]}"
        for (name, txn), (jj, b, e) in acked.items():
            if jj == j:
                assert seen[(name, txn)] == 1, (name, txn)
                assert data[b:e] == _record(name, txn), (name, txn, b, e)
    assert Counter(name for name, _ in acked) == Counter(expected)


# -- (1) and (4) ----------------------------------------------------------------------

async def test_dropped_response_is_resent_and_lands_once_and_refusals(cluster3, tmp_path) -> None:  # noqa: ANN001
    c, j = cluster3, "eo/proxy"
    await _setup(c, [j])
    primary = await _primary(c, j)
    async with FaultProxy("client-primary", primary.endpoint, seed=1) as proxy:
        producer = Producer.start("dropper", tmp_path)
        history = producer.history()
        first = history.next()
        async with Client([primary.endpoint]) as direct:
            before = await direct.write_head(j)
        # Only the proxy is known to this client (no route learned yet).
        async with Client([proxy.endpoint], rpc_timeout=1.5, retry_timeout=30.0) as client:
            await client.list_brokers()  # a pooled connection, past its hello (a listing
            # of journals would teach it their routes: List primes the route cache)
            proxy.set_fault(Fault(FaultMode.ONE_WAY, direction="down"))  # answers are lost
            task = asyncio.create_task(client.append(j, b"once\n", txn=first))
            deadline = time.monotonic() + 20
            async with Client([primary.endpoint]) as direct:
                while await direct.write_head(j) < before + 5:  # the commit landed...
                    assert time.monotonic() < deadline and not task.done()
                    await asyncio.sleep(0.05)  # ...while the client still waits
            # The held answer is lost with the connection (RST); then the link heals
            # and the client's re-send gets through.
            proxy.set_fault(Fault(FaultMode.RESET))
            proxy.heal()
            r = await asyncio.wait_for(task, 30)
            assert (r.begin, r.end) == (before, before + 5)  # the ORIGINAL commit
            assert proxy.stats.accepted >= 2  # it was re-sent
            nxt = await client.append(j, b"next\n", txn=history.next())
            assert nxt.begin == before + 5
        data = await _read(primary.endpoint, j, nxt.end)
        assert data[before:] == b"once\nnext\n"

        async with Client([n.endpoint for n in c.nodes]) as client:
            # (4) skip ahead; a newer generation retires the older; a closed history.
            with pytest.raises(TxnOutOfOrder, match="skips ahead"):
                await client.append(j, b"x\n", txn=TxnId("dropper", producer.generation, 1, 9))
            newer = Producer.start("dropper", tmp_path)
            assert newer.generation == producer.generation + 1
            h2 = newer.history()
            await client.append(j, b"gen2\n", txn=h2.next())
            with pytest.raises(ProducerGenerationRetired, match="is retired: generation 2"):
                await client.append(j, b"old\n", txn=history.next())
            last = h2.next().closing()
            closed = await client.append(j, b"bye\n", txn=last)
            again = await client.append(j, b"bye\n", txn=last)  # a re-sent close: original
            assert (again.begin, again.end) == (closed.begin, closed.end)
            with pytest.raises(HistoryClosed, match="closed by txn 2"):
                await client.append(j, b"after\n", txn=h2.next())
            head = await client.write_head(j)
        data = await _read(primary.endpoint, j, head)
        assert data[before:] == b"once\nnext\ngen2\nbye\n"

    # `quire append --producer`: a new generation per run, persisted in --state-dir.
    env = {**os.environ, "QUIRE_BROKER": primary.endpoint}
    for expect in (1, 2):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tools.cli.main", "append", "-j", j, "--producer", "cli",
            "--state-dir", str(tmp_path / "cli"), "-o", "json", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
        out, err = await asyncio.wait_for(proc.communicate(b"from the cli\n"), 60)
        assert proc.returncode == 0, err.decode()[-2000:]
        assert json.loads(out)["bytes"] == 13
        assert (tmp_path / "cli" / "cli.generation").read_text().strip() == str(expect)


# -- (2) --------------------------------------------------------------------------------

async def test_kill9_primary_every_txn_exactly_once(cluster4, tmp_path) -> None:  # noqa: ANN001
    c = cluster4
    journals = ["eo/kill-a", "eo/kill-b"]
    await _setup(c, journals)
    victim = await _primary(c, journals[0])
    per_writer = 2000 if FULL else 300
    names = [f"w{i}" for i in range(10)]
    acked: dict = {}
    endpoints = [n.endpoint for n in c.nodes]

    async def killer() -> None:
        while len(acked) < len(names) * per_writer // 4:
            await asyncio.sleep(0.005)  # appends are in flight on every pipeline here
        c.kill(victim, signal.SIGKILL)

    async with asyncio.TaskGroup() as tg:
        tg.create_task(killer())
        for i, name in enumerate(names):
            tg.create_task(_writer(endpoints, name, journals[i % 2], per_writer,
                                   str(tmp_path), acked))
    assert victim.proc.poll() is not None
    await _check_exactly_once(c, journals, acked, {n: per_writer for n in names})


# -- (3) --------------------------------------------------------------------------------

async def test_every_replica_restarts_and_resends_land_once(cluster3, tmp_path) -> None:  # noqa: ANN001
    c = cluster3
    journals = ["eo/restart-a", "eo/restart-b"]
    await _setup(c, journals)
    names = [f"r{i}" for i in range(4)]
    acked: dict = {}
    endpoints = [n.endpoint for n in c.nodes]
    histories = await asyncio.gather(*(
        _writer(endpoints, name, journals[i % 2], 50, str(tmp_path), acked)
        for i, name in enumerate(names)))

    for n in c.nodes:  # every replica, at once (as `quire up` stops them)
        c.kill(n, signal.SIGTERM)
    for n in c.nodes:
        assert n.proc.wait(30) == 0, c.tail(n)
    for j in journals:
        # The drain rolled the spools and recorded write heads — with the producer
        # table — where the next incarnations resume (drain.py); one is enough (the
        # others roll forward to it at the first sync). Without any, the open spool
        # (content and table alike) is dropped at restart.
        heads = [Path(n.spool_dir) / j / ".head.json" for n in c.nodes]
        heads = [json.loads(h.read_text()) for h in heads if h.exists()]
        assert heads, f"no replica recorded a head for {j}: {[c.tail(n) for n in c.nodes]}"
        assert all(h["producers"]["marks"] for h in heads), heads
    for n in c.nodes:
        c.start(n)
    for n in c.nodes:
        await c.wait_listening(n)
    for j in journals:
        assert (await wait_appendable(c.nodes[0].endpoint, j)).status == Status.OK

    async with Client(endpoints, retry_timeout=30.0) as client:
        # A writer that never heard its last answers re-sends them: each is answered
        # with its original commit by the restarted replicas' table, never written again.
        for i, (name, h) in enumerate(zip(names, histories)):
            txn = TxnId(name, h.generation, h.id, h.last)
            r = await client.append(journals[i % 2], _record(name, h.last), txn=txn)
            assert (journals[i % 2], r.begin, r.end) == acked[(name, h.last)]
    await asyncio.gather(*(
        _writer(endpoints, name, journals[i % 2], 20, str(tmp_path), acked, history=h)
        for i, (name, h) in enumerate(zip(names, histories))))
    await _check_exactly_once(c, journals, acked, {n: 70 for n in names})

    # AppendService(exactly_once=True): batches identified per journal history.
    async with Client(endpoints) as client:
        async with AppendService(client, exactly_once=True, producer="svc",
                                 state_dir=tmp_path) as svc:
            futs = [await svc.append(journals[0], _record("svc", k)) for k in range(1, 101)]
            await svc.flush()
        results = [f.result() for f in futs]
        assert svc.producer.generation == 1 and svc.commit_unknown_resends == 0
    end = max(r.end for r in results)
    data = await _read(c.nodes[0].endpoint, journals[0], end)
    seen = _txns(data)
    assert all(seen[("svc", k)] == 1 for k in range(1, 101))
    assert all(data[r.begin:r.end] == _record("svc", k) for k, r in enumerate(results, 1))
