"""On a real coordinator, plain appends that arrive whole take the whole-append lane
(quire_appends_whole_total counts them) and every other append still takes the FSM:
a guard against the lane silently never being used — nothing else would fail then."""

from __future__ import annotations

import asyncio
import signal

import pytest

from protocol import AppendChunk, AppendCommit, AppendRequest, AppendResponse, LabelSet, Status
from quire.client import Client
from tools.services import free_port

from .cluster import Conn, running, scrape_metric, serve_journal

pytestmark = pytest.mark.timeout(120)

J = "lane/j"


def _metric(port: int, name: str, labels: str = "") -> float:
    return scrape_metric(port, name, labels) or 0.0


async def test_plain_whole_appends_take_the_lane_and_others_the_fsm(etcd, etcd_root) -> None:  # noqa: ANN001
    mport = free_port()
    with running(etcd.url, etcd_root, 1, extra=["--metrics-port", str(mport)]) as c:
        node = c.nodes[0]
        await serve_journal(c, J, replication=1)
        conn = await Conn.open(node.endpoint)
        ok0, whole0 = (_metric(mport, "quire_appends_total", '{status="OK"}'),
                       _metric(mport, "quire_appends_whole_total"))
        for i in range(20):  # request, chunk and commit leave in one send: whole
            r = await conn.append(J, [b"%04d\n" % i])
            assert r.status == Status.OK and r.commit.end - r.commit.begin == 5
        # Registers are the FSM's: it serves this one, and the lane the next again.
        r = await conn.append(J, [b"edit\n"], union_registers=LabelSet.of({"k": "v"}))
        assert r.status == Status.OK and r.registers == LabelSet.of({"k": "v"})
        last = await conn.append(J, [b"last\n"])
        assert last.status == Status.OK and last.registers == LabelSet.of({"k": "v"})  # carried
        await conn.close()
        ok = _metric(mport, "quire_appends_total", '{status="OK"}') - ok0
        whole = _metric(mport, "quire_appends_whole_total") - whole0
        assert ok == 22
        # Loopback delivers each small append in one piece: the lane takes them all but
        # the FSM's own (allowing for a rare split delivery, which the FSM then serves).
        assert 15 <= whole <= 21, (ok, whole)
        # Sixteen connections' appends sent at once: the lane commits several together.
        # The coordinator is stopped while they are sent, so all sixteen are readable
        # when it runs again, whatever the machine's load (under stress-ng a running
        # coordinator took each before the next was sent: 80 commits of 80).
        commits0, whole0 = _metric(mport, "quire_lane_commits_total"), whole + whole0
        conns = [await Conn.open(node.endpoint) for _ in range(16)]
        assert node.proc is not None
        for round_ in range(5):
            node.proc.send_signal(signal.SIGSTOP)
            try:
                for i, k in enumerate(conns):
                    k.s.write(AppendRequest(journal=J))
                    k.s.write(AppendChunk(), b"%d-%02d\n" % (round_, i))
                    k.s.write(AppendCommit())
                for k in conns:
                    k.s.flush()  # (each one send, now)
                    await k.s.drain()
            finally:
                node.proc.send_signal(signal.SIGCONT)
            for k in conns:
                msg, _ = await asyncio.wait_for(k.s.read_message(AppendResponse), 30.0)
                assert msg.status == Status.OK
        for k in conns:
            await k.close()
        commits = _metric(mport, "quire_lane_commits_total") - commits0
        whole = _metric(mport, "quire_appends_whole_total") - whole0
        assert 0 < commits < whole <= 80, (commits, whole)


async def test_an_ok_answer_omits_the_header_the_client_holds(etcd, etcd_root) -> None:  # noqa: ANN001
    """AppendRequest.route_revision: an OK answer resolved at the revision of the
    client's route comes without its header — on the lane and on the FSM alike —
    while any other answer (an older revision, a failure) carries it."""
    with running(etcd.url, etcd_root, 1) as c:
        node = c.nodes[0]
        await serve_journal(c, J, replication=1)
        conn = await Conn.open(node.endpoint)
        first = await conn.append(J, [b"a"])
        assert first.status == Status.OK and first.header is not None
        held, r = first.header, first
        for _ in range(10):  # (etcd may move on meanwhile: then the answer says so)
            r = await conn.append(J, [b"b"], route_revision=held.etcd.revision)
            assert r.status == Status.OK
            if r.header is None:
                break
            held = r.header
        assert r.header is None and r.commit.end > first.commit.end
        fsm = await conn.append(J, [b"c"], route_revision=held.etcd.revision,
                                union_registers=LabelSet.of({"k": "v"}))  # the FSM's
        assert fsm.status == Status.OK
        assert fsm.header is None or fsm.header.etcd.revision != held.etcd.revision
        older = await conn.append(J, [b"d"], route_revision=held.etcd.revision - 1)
        assert older.status == Status.OK and older.header is not None
        wrong = await conn.append(J, [b"e"], offset=1, route_revision=held.etcd.revision)
        assert wrong.status == Status.WRONG_APPEND_OFFSET and wrong.header is not None
        await conn.close()
        async with Client([node.endpoint]) as client:  # names the revision it holds
            for _ in range(3):
                await client.append(J, b"f")
            request = client._plain_requests[J][0]  # noqa: SLF001
            assert request.route_revision == client.routes.revision(J) > 0
