"""Exactly-once appends survive a kill -9 of every replica at once (issue 17, part (3);
docs/exactly-once.md "What survives what").

Identified writers append to a replication-3 journal whose fragments roll every few
KiB; every coordinator is killed with SIGKILL at once and restarted from its spool
directory. Each replica replays its marks log (coordinator/producer_log.py): the
transactions in sealed fragments are known again, so every acknowledged transaction
re-sent after the restart is answered — the last of each history with its original
offsets, earlier ones TXN_SUPERSEDED — and none is written twice. A transaction whose
bytes were in the open spool (dropped at the restart, with its mark) is written again,
once, after `reset-head`.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from protocol import JournalSpec, Status
from protocol.errors import IndexHasGreaterOffset, TxnSuperseded
from quire.client import Client, Producer, TxnId

from .cluster import Cluster, Conn, running, spec, wait_appendable
from .test_exactly_once import _record, _txns

pytestmark = pytest.mark.timeout(180)

LENGTH = 2048
"""Fragment length: a roll every ~9 records, so most transactions are in sealed files."""


@pytest.fixture
def cluster3(etcd, etcd_root):  # noqa: ANN001, ANN201
    with running(etcd.url, etcd_root) as c:
        yield c


async def crash_every_replica_and_resend(c: Cluster, journal_spec: JournalSpec, state_dir,  # noqa: ANN001
                                         before_kill=None) -> None:  # noqa: ANN001
    """The scenario, on a started cluster: identified writers, everything sealed but
    one txn, `before_kill(acked_end)` (e.g. wait for persistence), SIGKILL of every
    coordinator, restart from the spool dirs, every txn re-sent, the journal checked."""
    J = journal_spec.name
    length = journal_spec.fragment.length
    for n in c.nodes:
        await c.wait_listening(n)
    conn = await Conn.open(c.nodes[0].endpoint)
    assert (await conn.apply(journal_spec)).status == Status.OK
    await conn.close()
    assert (await wait_appendable(c.nodes[0].endpoint, J)).status == Status.OK
    endpoints = [n.endpoint for n in c.nodes]

    names, per_writer = [f"k{i}" for i in range(4)], 40
    histories = {name: Producer.start(name, state_dir).history() for name in names}
    acked: dict[tuple[str, int], tuple[int, int]] = {}

    async def writer(name: str, client: Client) -> None:
        for _ in range(per_writer):
            txn = histories[name].next()
            r = await client.append(J, _record(name, txn.txn), txn=txn)
            acked[(name, txn.txn)] = (r.begin, r.end)

    tail = Producer.start("tail", state_dir).history()
    async with Client(endpoints, rpc_timeout=5.0, retry_timeout=60.0) as client:
        await asyncio.gather(*(writer(name, client) for name in names))
        t1 = tail.next()
        acked[("tail", 1)] = (r := await client.append(J, _record("tail", 1), txn=t1)).begin, r.end
        # A plain filler past the fragment length: the next append rolls first, so
        # everything above is sealed and only "tail" txn 2 is in the open spool.
        await client.append(J, b"\n" * length)
        t2 = tail.next()
        lost = await client.append(J, _record("tail", 2), txn=t2)
    sealed = lost.begin
    if before_kill is not None:
        await before_kill(sealed)

    for n in c.nodes:  # every replica at once: no drain, no .head.json
        c.kill(n, signal.SIGKILL)
    for n in c.nodes:
        n.proc.wait(10)
        assert os.path.exists(os.path.join(n.spool_dir, J, ".producers.log"))
        assert not os.path.exists(os.path.join(n.spool_dir, J, ".head.json"))
    for n in c.nodes:
        c.start(n)
    for n in c.nodes:
        await c.wait_listening(n)

    async with Client(endpoints, rpc_timeout=5.0, retry_timeout=60.0) as client:
        # Every acknowledged transaction is re-sent, in order, as a writer that heard
        # none of its answers would. The replayed tables answer all of them.
        for name in names:
            h = histories[name]
            for txn in range(1, per_writer + 1):
                t = TxnId(name, h.generation, h.id, txn)
                if txn < per_writer:
                    with pytest.raises(TxnSuperseded, match=f"txn {per_writer} was already acted on"):
                        await client.append(J, _record(name, txn), txn=t)
                else:
                    r = await client.append(J, _record(name, txn), txn=t)
                    assert (r.begin, r.end) == acked[(name, txn)]  # the ORIGINAL commit
        r = await client.append(J, _record("tail", 1), txn=t1)
        assert (r.begin, r.end) == acked[("tail", 1)]
        # "tail" txn 2 was in the open spool: its bytes and its mark are gone, so it is
        # new — refused until the operator resets the head, then written once.
        with pytest.raises(IndexHasGreaterOffset):
            await client.append(J, _record("tail", 2), txn=t2)
        reset = await client.reset_head(J)
        assert reset.begin == sealed
        again = await client.append(J, _record("tail", 2), txn=t2)
        assert again.begin == sealed
        acked[("tail", 2)] = (again.begin, again.end)
        # ...and a re-send of it now gets that new commit.
        r = await client.append(J, _record("tail", 2), txn=t2)
        assert (r.begin, r.end) == (again.begin, again.end)
        # The writers' next transactions continue their histories.
        for name in names:
            txn = histories[name].next()
            r = await client.append(J, _record(name, txn.txn), txn=txn)
            acked[(name, txn.txn)] = (r.begin, r.end)
        end = max(e for _, e in acked.values())
        data = b""
        async for _, chunk in client.read(J, 0, end_offset=end):  # spools or the store
            data += chunk

    assert len(data) == end
    seen = _txns(data)  # the filler is empty lines
    assert not {k: v for k, v in seen.items() if v > 1}, "a transaction landed twice"
    for (name, txn), (b, e) in acked.items():
        assert seen[(name, txn)] == 1, (name, txn)
        assert data[b:e] == _record(name, txn), (name, txn)
    assert len(acked) == len(names) * (per_writer + 1) + 2


async def test_kill9_of_every_replica_keeps_the_producer_table(cluster3, tmp_path) -> None:  # noqa: ANN001
    await crash_every_replica_and_resend(cluster3, spec("eo/crash", length=LENGTH), tmp_path)
