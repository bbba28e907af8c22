"""append_api.proxy_append when the primary does not answer a connect (#31): with the
coordinator's broker at hand it resolves the journal again and forwards the append to
the primary its keyspace names now — nothing of the append reached the old one — and it
hands the append back to be run here when the journal moved to this coordinator.
(Over real hosts with an isolated primary: tests/hosts/test_proxy_failover.py.)"""

from __future__ import annotations

import asyncio
import socket
from types import SimpleNamespace

from coordinator.append_api import proxy_append
from protocol import (AppendChunk, AppendCommit, AppendRequest, AppendResponse, Etcd, Header,
                      Hello, HelloAck, ProcessId, Route, Status)
from protocol.stream import FrameStream, serve_frames

J = "proxy/journal"
A, B = ProcessId("z", "aaaa"), ProcessId("z", "bbbb")


class _ClientConn:
    def __init__(self) -> None:
        self.sent: list[object] = []

    async def send(self, msg, payload: bytes = b"") -> None:  # noqa: ANN001
        self.sent.append(msg)


class _Source:
    done = True

    def __init__(self, *items: bytes | None) -> None:
        self.items = list(items)
        self.read = 0

    async def next_chunk(self):  # noqa: ANN201
        self.read += 1
        return self.items.pop(0)

    def throttled(self, seconds: float) -> None:
        pass


def _refused_endpoint() -> str:
    """A loopback port nothing listens on (bound, then closed): a connect is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return "127.0.0.1:%d" % s.getsockname()[1]


def _res(endpoint: str, *, revision: int, is_primary: bool = False) -> SimpleNamespace:
    route = Route(members=(A, B), primary=0, endpoints=(endpoint, "h:2"))
    return SimpleNamespace(status=Status.OK, is_primary=is_primary, primary_endpoint=endpoint,
                           route=route, spec=None, revision=revision,
                           header=Header(route=route, etcd=Etcd(revision=revision)))


class _Broker:
    """The coordinator's side proxy_append uses: its lease TTL and a resolution that
    names `now` (the keyspace moved on)."""

    def __init__(self, now: SimpleNamespace) -> None:
        self.cfg = SimpleNamespace(lease_ttl=3.0)
        self.now = now
        self.resolves = 0

    async def resolve(self, journal: str, min_revision: int = 0) -> SimpleNamespace:
        self.resolves += 1
        return self.now


async def _new_primary(got: list[object]):  # noqa: ANN202
    async def serve(stream: FrameStream) -> None:
        assert isinstance((await stream.read()).message, Hello)
        await stream.send(HelloAck(process_id=B))
        while True:
            frame = await stream.read()
            got.append(frame.message)
            if isinstance(frame.message, AppendCommit):
                break
        await stream.send(AppendResponse(status=Status.OK))
        await stream.close()

    return await serve_frames(serve, "127.0.0.1", 0)


async def test_an_unreachable_primary_is_replaced_by_the_one_resolved_now() -> None:
    got: list[object] = []
    server = await _new_primary(got)
    new = "127.0.0.1:%d" % server.sockets[0].getsockname()[1]
    try:
        broker = _Broker(_res(new, revision=6))
        conn, source = _ClientConn(), _Source(b"record\n", None)
        kept = await proxy_append(conn, AppendRequest(journal=J),
                                  _res(_refused_endpoint(), revision=5), source, None, broker)
        assert kept is True
        (resp,) = conn.sent
        assert resp.status == Status.OK, resp
        assert broker.resolves >= 1
        req = got[0]
        assert isinstance(req, AppendRequest) and req.header.etcd.revision == 6, req
        assert [type(m) for m in got[1:]] == [AppendChunk, AppendCommit]
    finally:
        server.close()
        await server.wait_closed()


async def test_the_journal_moved_here_hands_the_append_back_unread() -> None:
    broker = _Broker(_res("me:1", revision=6, is_primary=True))
    conn, source = _ClientConn(), _Source(b"record\n", None)
    kept = await proxy_append(conn, AppendRequest(journal=J), _res(_refused_endpoint(), revision=5),
                              source, None, broker)
    assert kept is None and conn.sent == [] and source.read == 0


async def test_no_reachable_primary_within_the_budget_is_a_definite_unavailable() -> None:
    dead = _refused_endpoint()
    broker = _Broker(_res(dead, revision=5))
    broker.cfg.lease_ttl = 0.5  # budget 2 * 0.5 + 2 = 3 s of paced retries
    conn, source = _ClientConn(), _Source(b"record\n", None)
    kept = await proxy_append(conn, AppendRequest(journal=J), _res(dead, revision=5), source,
                              None, broker)
    assert kept is False and source.read == 0
    (resp,) = conn.sent
    assert resp.status == Status.UNAVAILABLE and dead in resp.message, resp
    assert 2 <= broker.resolves <= 10, broker.resolves  # paced, ~1 connect a second
