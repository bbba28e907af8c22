"""Bytes a member's gap needs can be held by a member the route just dropped.

Chaos campaign seed 3 (docs/reliability.md, "a read skipped a former primary's exposed
tail"): a primary's last append ended COMMIT_UNKNOWN, its next sync proposal rolled
every peer forward past that tail (without its bytes), and a moment later the route
dropped the primary. Until it persisted its closed fragment it was the only holder; a
consumer reading through the new primary's gap was answered from the route's peers up to
where they held bytes, and then skipped the rest — ten events never counted. Now the
gap is asked of every live member (the route's peers first), a former member answers a
`held_only` read from what it still holds, and a blocking read waits (bounded) for the
index before it skips what no one holds.

In process: one Replica per side, the read RPC served over a loopback socket."""

from __future__ import annotations

import asyncio
import types
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from coordinator import read_api
from coordinator.read_relay import gap_holders
from coordinator.replica import Replica, lineage_agrees_until
from coordinator.spool import MemoryFiles
from protocol import ProcessId, ReadContent, ReadRequest, ReadResponse, Route, Status
from protocol.stream import FrameStream, serve_frames
from topology.membership import BrokerSpec

J = "gaps/former"


def _pid(suffix: str) -> ProcessId:
    return ProcessId(zone="zone-a", suffix=suffix)


def _member(suffix: str, endpoint: str) -> types.SimpleNamespace:
    return types.SimpleNamespace(spec=BrokerSpec(id=_pid(suffix), endpoint=endpoint))


def test_gap_holders_asks_the_route_first_then_every_other_live_member() -> None:
    me, a, b, former, other = (_pid(s) for s in ("me", "a", "b", "former", "other"))
    route = Route(members=(a, b, me), primary=0, endpoints=("ep-a", "ep-b", "ep-me"))
    keyspace = types.SimpleNamespace(members={
        me: _member("me", "ep-me"), a: _member("a", "ep-a"), b: _member("b", "ep-b"),
        other: _member("other", "ep-other"), former: _member("former", "ep-former")})
    broker = types.SimpleNamespace(me=me, keyspace=keyspace)
    assert gap_holders(broker, route, me) == ["ep-a", "ep-b", "ep-former", "ep-other"]
    # A broker without a keyspace (tests, tools) asks the route alone.
    assert gap_holders(types.SimpleNamespace(me=me), route, me) == ["ep-a", "ep-b"]


def _commit(replica: Replica, data: bytes, epoch: int = 7) -> None:
    spool = replica.spool
    spool.apply_content(spool.delta, data)
    spool.apply_proposal(spool.commit_proposal(), primary=True, epoch=epoch)
    replica.publish(spool.end)


def _broker(replica: Replica, is_member: bool) -> types.SimpleNamespace:
    res = types.SimpleNamespace(status=Status.OK, header=None, is_member=is_member, current=True,
                                spec=types.SimpleNamespace(readable=True),
                                route=Route(members=(), primary=-1, endpoints=()))

    async def resolve(journal: str, min_revision: int = 0) -> types.SimpleNamespace:
        return res

    return types.SimpleNamespace(me=_pid("me"), resolve=resolve, replicas={J: replica},
                                 replica=lambda journal: replica,
                                 keyspace=types.SimpleNamespace(members={}))


@asynccontextmanager
async def _served(serve: Callable[[FrameStream], object]) -> AsyncIterator[FrameStream]:
    """A client FrameStream whose server side runs `serve(conn)` once."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def handle(conn: FrameStream) -> None:
        try:
            await serve(conn)
            done.set_result(None)
        except BaseException as exc:  # noqa: BLE001 - surfaced to the test
            done.set_exception(exc)
        finally:
            await conn.close()  # flushes what is still queued

    server = await serve_frames(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = await FrameStream.connect(f"127.0.0.1:{port}")
    try:
        yield client
        await asyncio.wait_for(done, 10)
    finally:
        client.abort()
        server.close()
        await server.wait_closed()


async def _read(client: FrameStream, end: int) -> tuple[bytes, list[ReadResponse]]:
    data, metas = b"", []
    while len(data) < end:
        frame = await asyncio.wait_for(client.read(), 10)
        if isinstance(frame.message, ReadResponse):
            metas.append(frame.message)
            if frame.message.status != Status.OK:
                break
        elif isinstance(frame.message, ReadContent):
            assert frame.message.offset == len(data), (frame.message.offset, len(data))
            data += bytes(frame.payload)
    return data, metas


def test_lineage_agrees_until_the_first_offset_of_another_epoch() -> None:
    mine = ((3, 0), (7, 100), (9, 250))
    assert lineage_agrees_until(mine, ((3, 0), (7, 100)), 120, 240) == 240
    assert lineage_agrees_until(mine, ((3, 0), (7, 100)), 120, 300) == 250  # 9 vs 7
    assert lineage_agrees_until(mine, ((3, 0), (5, 180)), 120, 300) == 120  # 7 vs 3
    assert lineage_agrees_until(mine, ((7, 100), (8, 200)), 150, 300) == 200
    # An offset older than either history says nothing: no agreement.
    assert lineage_agrees_until(mine, ((7, 100),), 50, 300) == 50
    assert lineage_agrees_until((), mine, 120, 300) == 120


async def test_a_former_member_serves_a_held_only_read_from_what_it_still_holds() -> None:
    replica = Replica(J, MemoryFiles())
    content = b"only the former primary holds this tail\n"
    _commit(replica, content, epoch=7)
    assert replica.spool.epochs == ((7, 0),)
    broker = _broker(replica, is_member=False)
    req = ReadRequest(journal=J, offset=0, end_offset=len(content), do_not_proxy=True,
                      held_only=True, lineage=((7, 0),))
    async with _served(lambda conn: read_api.serve_read(broker, conn, req)) as client:
        data, metas = await _read(client, len(content))
    assert [m.status for m in metas] == [Status.OK]
    assert data == content
    # A tail of another lineage (the asker's history has epoch 9 from offset 10: a later
    # epoch cut ours there and wrote other bytes) is served only up to where they part.
    req = ReadRequest(journal=J, offset=0, end_offset=len(content), do_not_proxy=True,
                      held_only=True, lineage=((7, 0), (9, 10)))
    async with _served(lambda conn: read_api.serve_read(broker, conn, req)) as client:
        data, metas = await _read(client, len(content))
    assert data == content[:10]
    assert metas[-1].status == Status.OFFSET_NOT_YET_AVAILABLE and metas[-1].offset == 10
    # Any other read at a non-member still says so (the reader goes to the route).
    plain = ReadRequest(journal=J, offset=0, do_not_proxy=True)
    async with _served(lambda conn: read_api.serve_read(broker, conn, plain)) as client:
        _, metas = await _read(client, 1)
    assert [m.status for m in metas] == [Status.NOT_JOURNAL_BROKER]


async def test_a_blocking_read_waits_for_a_gap_to_be_held_before_skipping_it() -> None:
    replica = Replica(J, MemoryFiles())
    below = b"committed before the roll, held by no one we know of yet\n"
    _commit(replica, below)
    replica.spool.apply_proposal(replica.spool.roll_proposal(), primary=True)
    closed, replica.local = replica.local, []  # the gap: not held here (yet)
    after = b"after the gap\n"
    _commit(replica, after)
    assert replica.next_offset_after_gap(0) == len(below)  # what a skip would jump to
    broker = _broker(replica, is_member=True)
    want = below + after
    req = ReadRequest(journal=J, offset=0, end_offset=len(want), block=True)

    async def appear() -> None:
        await asyncio.sleep(0.3)  # e.g. the index shows the former member's fragment
        replica.local = closed
        replica.wake()

    showing = asyncio.ensure_future(appear())
    async with _served(lambda conn: read_api.serve_read(broker, conn, req)) as client:
        data, _ = await _read(client, len(want))
    await showing
    assert data == want


async def test_a_blocking_read_skips_a_gap_no_one_holds_after_the_bound(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(read_api, "GAP_WAIT", 0.2)
    replica = Replica(J, MemoryFiles())
    lost = b"lost by every replica\n"
    _commit(replica, lost)
    replica.spool.apply_proposal(replica.spool.roll_proposal(), primary=True)
    replica.local = []
    after = b"after the gap\n"
    _commit(replica, after)
    broker = _broker(replica, is_member=True)
    req = ReadRequest(journal=J, offset=0, end_offset=len(lost) + len(after), block=True)
    async with _served(lambda conn: read_api.serve_read(broker, conn, req)) as client:
        frame = await asyncio.wait_for(client.read(), 10)
        assert isinstance(frame.message, ReadResponse)
        assert frame.message.offset == len(lost)  # jumped, after waiting
        content = await asyncio.wait_for(client.read(), 10)
        assert bytes(content.payload) == after
