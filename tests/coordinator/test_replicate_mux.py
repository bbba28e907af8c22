"""The multiplexed replicate connection (protocol/mux.py, coordinator/replicate_mux.py):
every journal's stream to one peer is a channel of one connection.

The primary's side is the real Pipeline over a real MuxPool; the replica's side is the
real ReplicaMux behind serve_frames, with real spools on disk, and a broker that
resolves every journal to the one route (what the coordinator's keyspace would say)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
from types import SimpleNamespace

import pytest

from coordinator.auth_gate import Gate, PeerTokens
from coordinator.pipeline import REPLICATE_ACK, Pipeline, PipelineBroken
from coordinator.replica import Replica
from coordinator.replicate_mux import ReplicaMux
from coordinator.spool import DiskFiles
from protocol import Etcd, Header, Hello, HelloAck, ProcessId, ReplicateProposal, Route, Status
from protocol.auth import Capability, Keyring, Scope
from protocol.errors import ProtocolError
from protocol.mux import CHANNEL
from protocol.mux_pool import MuxPool
from protocol.stream import FrameStream, serve_frames

ME = ProcessId("z", "primary")
PEER = ProcessId("z", "peer")
RING = Keyring([os.urandom(32)])


class _Peer:
    """The replica's coordinator, as ReplicaMux sees it (Server's gate, me, resolve,
    replica, _labels_of), serving multiplexed connections only."""

    def __init__(self, tmp_path, keyring: Keyring | None = None) -> None:  # noqa: ANN001
        self.gate = Gate(keyring)
        self.me = PEER
        self.topology = None
        self.files = DiskFiles(tmp_path)
        self.replicas: dict[str, Replica] = {}
        self.accepted = 0
        self.muxes: list[ReplicaMux] = []
        self.served: list[asyncio.Task] = []
        self.server: asyncio.Server | None = None
        self.route = Route(members=(ME, PEER), primary=0)
        self.header = Header(route=self.route, etcd=Etcd(revision=1))

    async def start(self) -> str:
        async def accept(conn: FrameStream) -> None:
            self.accepted += 1
            hello = (await conn.read()).message
            assert isinstance(hello, Hello) and hello.mux
            await conn.send(HelloAck(process_id=PEER, mux=True))
            mux = ReplicaMux(self, conn)
            self.muxes.append(mux)
            # serve() must end as it says, however the connection ends; it raised a
            # TypeError once, compiled: mypyc had kept `self.failed` narrowed to None
            # across an await (replicate_mux.py `_ended`).
            served = asyncio.ensure_future(mux.serve())
            self.served.append(served)
            try:
                await asyncio.shield(served)
            finally:
                conn.abort()

        self.server = await serve_frames(accept, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.route = Route(members=(ME, PEER), primary=0, endpoints=("127.0.0.1:1", f"127.0.0.1:{port}"))
        self.header = Header(route=self.route, etcd=Etcd(revision=1))
        return f"127.0.0.1:{port}"

    async def resolve(self, journal: str, min_revision: int = 0) -> SimpleNamespace:
        return SimpleNamespace(status=Status.OK, is_member=True, route=self.route,
                               header=self.header)

    def replica(self, journal: str) -> Replica:
        r = self.replicas.get(journal)
        if r is None:
            r = self.replicas[journal] = Replica(journal, self.files)
        return r

    def _labels_of(self, journal: str) -> None:
        return None

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for mux in self.muxes:
            mux.fail(ConnectionError("stopping"))
        await self.server.wait_closed()
        done = await asyncio.wait_for(asyncio.gather(*self.served, return_exceptions=True), 10)
        assert all(r is None for r in done), done


async def _pipeline(peer: _Peer, pool: MuxPool, journal: str, tmp_path, token: str = "",  # noqa: ANN001
                    replica: Replica | None = None) -> Pipeline:
    """A synchronized pipeline of `journal` (a new primary replica under tmp_path, or
    `replica` whose spool lock we hold already)."""
    if replica is None:
        replica = Replica(journal, DiskFiles(tmp_path / "primary"))
        await replica.spool_lock.acquire()
    pln = await Pipeline.open(replica, peer.header, ME, token=token, mux=pool)
    pln.send_proposal(replica.spool.rollback_proposal(acknowledge=True), first=True)
    (answer,) = await pln.ticket()
    assert answer[1].status == Status.OK, answer
    return pln


async def _append(pln: Pipeline, data: bytes) -> None:
    pln.send_content(data)
    pln.send_proposal(pln.spool.commit_proposal())
    await asyncio.wait_for(pln.ticket(must_ok=True), 10)


async def _released(peer: _Peer, journals: list[str]) -> None:
    """Every one of these replicas' spools is free at the peer (its stream ended)."""
    for journal in journals:
        lock = peer.replicas[journal].spool_lock
        await asyncio.wait_for(lock.acquire(), 5)
        lock.release()


@contextlib.asynccontextmanager
async def _serving(tmp_path, keyring: Keyring | None = None):  # noqa: ANN001, ANN202
    """A peer serving on loopback, and a pool of the primary's connections."""
    peer = _Peer(tmp_path / "peer", keyring)
    await peer.start()
    pool = MuxPool(REPLICATE_ACK)
    try:
        yield peer, pool
    finally:
        pool.close()
        await peer.stop()


async def test_every_journal_rides_one_connection(tmp_path) -> None:  # noqa: ANN001
    async with _serving(tmp_path) as (peer, pool):
        # Opened at once: they wait for the one connection the first of them makes.
        plns = await asyncio.gather(*(_pipeline(peer, pool, f"mux/j{i}", tmp_path)
                                      for i in range(5)))
        for round_ in range(3):
            for i, pln in enumerate(plns):
                await _append(pln, b"j%d r%d;" % (i, round_))
        assert peer.accepted == 1 and len(pool.connections()) == 1
        for i in range(5):
            spool = peer.replicas[f"mux/j{i}"].spool
            assert spool.end == sum(len(b"j%d r%d;" % (i, r)) for r in range(3))
        for pln in plns:
            await pln.close()
        # A closed channel gives its spool back at the replica (a new primary may take it).
        await _released(peer, [f"mux/j{i}" for i in range(5)])


async def test_a_bad_frame_ends_its_channel_only(tmp_path) -> None:  # noqa: ANN001
    async with _serving(tmp_path) as (peer, pool):
        a = await _pipeline(peer, pool, "mux/a", tmp_path)
        b = await _pipeline(peer, pool, "mux/b", tmp_path)
        await _append(a, b"a0")
        # A frame of a's channel whose header is not msgpack (0xc1 is never used).
        bad = struct.pack("!IBI", 6, ReplicateProposal.KIND, 1) + b"\xc1"
        chan_a = a._streams[0]
        chan_a.write_encoded([bad])
        with pytest.raises(PipelineBroken, match="BAD_REQUEST"):
            a.send_proposal(a.spool.commit_proposal())
            await asyncio.wait_for(a.ticket(must_ok=True), 10)
        # Once broken, it stays broken: nothing more rides it.
        with pytest.raises(PipelineBroken):
            a.send_content(b"more")
        await _append(b, b"b0")  # the other journal's channel carries on
        await _append(b, b"b1")
        assert peer.accepted == 1
        # a's spool was rolled back and released at the replica: a new pipeline takes it.
        a2 = await _pipeline(peer, pool, "mux/a", tmp_path, replica=a.replica)
        await _append(a2, b"a1")
        assert peer.replicas["mux/a"].spool.end == 4 and peer.replicas["mux/b"].spool.end == 4
        assert peer.accepted == 1


async def test_a_malformed_envelope_ends_the_connection_and_its_channels_rebuild(tmp_path) -> None:  # noqa: ANN001
    async with _serving(tmp_path) as (peer, pool):
        plns = [await _pipeline(peer, pool, f"mux/c{i}", tmp_path) for i in range(3)]
        for pln in plns:
            await _append(pln, b"x")
        (conn,) = pool.connections()
        # A frame of an unknown kind: the connection is unreadable from here on.
        conn.stream.transport.write(CHANNEL.pack(1) + struct.pack("!IBI", 5, 250, 0))
        for pln in plns:
            with pytest.raises(PipelineBroken):
                pln.send_content(b"y")
                pln.send_proposal(pln.spool.commit_proposal())
                await asyncio.wait_for(pln.ticket(must_ok=True), 10)
        # The replica said why, on channel 0, before it closed the connection.
        assert "BAD_REQUEST: unknown frame kind 250" in str(conn.failed), conn.failed
        # Every journal rebuilds, over a new connection; the replicas' spools were released.
        await _released(peer, [f"mux/c{i}" for i in range(3)])
        again = [await _pipeline(peer, pool, f"mux/c-new{i}", tmp_path) for i in range(3)]
        for pln in again:
            await _append(pln, b"z")
        assert peer.accepted == 2 and len(pool.connections()) == 1


async def test_losing_the_connection_breaks_every_channel(tmp_path) -> None:  # noqa: ANN001
    async with _serving(tmp_path) as (peer, pool):
        plns = [await _pipeline(peer, pool, f"mux/d{i}", tmp_path) for i in range(3)]
        for pln in plns:
            pln.send_content(b"in flight")
            pln.send_proposal(pln.spool.commit_proposal())
        tickets = [pln.ticket(must_ok=True) for pln in plns]
        (conn,) = pool.connections()
        conn.stream.transport.abort()
        # Each append either was acknowledged before the loss or fails: none hangs.
        results = await asyncio.wait_for(asyncio.gather(*tickets, return_exceptions=True), 10)
        assert all(isinstance(r, (list, PipelineBroken)) for r in results), results
        for pln in plns:
            with pytest.raises(PipelineBroken):
                pln.send_content(b"after")
                pln.send_proposal(pln.spool.commit_proposal())
                await asyncio.wait_for(pln.ticket(must_ok=True), 10)
        await _released(peer, [f"mux/d{i}" for i in range(3)])
        again = await _pipeline(peer, pool, "mux/d-new", tmp_path)
        await _append(again, b"ok")
        assert peer.accepted == 2


async def test_each_channel_presents_its_own_token(tmp_path) -> None:  # noqa: ANN001
    tokens = PeerTokens(RING, f"peer:{ME}")
    async with _serving(tmp_path, RING) as (peer, pool):
        ok = await _pipeline(peer, pool, "mux/mine", tmp_path,
                             token=tokens.token(Capability.REPLICATE, "mux/mine"))
        # A token for another journal opens the channel (Hello) but the stream's first
        # proposal is refused: FORBIDDEN, on that channel only.
        with pytest.raises(AssertionError, match="FORBIDDEN"):
            await _pipeline(peer, pool, "mux/theirs", tmp_path / "t",
                            token=tokens.token(Capability.REPLICATE, "mux/mine"))
        with pytest.raises(PipelineBroken, match="UNAUTHORIZED"):
            await _pipeline(peer, pool, "mux/none", tmp_path / "n", token="not a token")
        await _append(ok, b"still here")
        assert peer.accepted == 1
        assert peer.replicas["mux/mine"].spool.end == len(b"still here")
        assert "mux/theirs" not in peer.replicas  # refused before any spool was touched


async def test_a_channel_is_cut_when_its_token_expires(tmp_path) -> None:  # noqa: ANN001
    tokens = PeerTokens(RING, f"peer:{ME}")
    short = RING.mint(Capability.REPLICATE, Scope.of(["mux/short"]), 0.5, "short-lived-peer")
    async with _serving(tmp_path, RING) as (peer, pool):
        cut = await _pipeline(peer, pool, "mux/short", tmp_path, token=short)
        kept = await _pipeline(peer, pool, "mux/kept", tmp_path,
                               token=tokens.token(Capability.REPLICATE, "mux/kept"))
        channel = cut._streams[0]
        async with asyncio.timeout(30):  # (0.5 s + the 5 s leeway)
            while channel.closed is None:
                await asyncio.sleep(0.1)
        assert "token expired" in str(channel.closed)
        with pytest.raises(PipelineBroken):
            await _append(cut, b"late")
        await _released(peer, ["mux/short"])
        await _append(kept, b"on time")  # the connection and its other channel go on
        assert peer.accepted == 1


async def test_a_coordinator_survives_a_malformed_replicate_connection(etcd, etcd_root) -> None:  # noqa: ANN001
    """A real coordinator: garbage on a multiplexed connection gets a typed error on
    channel 0 and that connection closed; the process serves on, replication too."""
    from protocol import ErrorFrame
    from protocol.wire import decode_header

    from .cluster import Conn, running, spec, wait_appendable

    with running(etcd.url, etcd_root) as cluster:
        for n in cluster.nodes:
            await cluster.wait_listening(n)
        endpoint = cluster.nodes[1].endpoint
        s = await FrameStream.connect(endpoint, timeout=5.0)
        await s.send(Hello(mux=True))
        ack, _ = await asyncio.wait_for(s.read_message(HelloAck), 10)
        assert ack.mux
        s.transport.write(CHANNEL.pack(7) + struct.pack("!IBI", 1 << 30, ReplicateProposal.KIND, 0))
        got = b""
        async with asyncio.timeout(10):
            while True:
                await s.protocol.wait_for_data()
                got = s.protocol.unconsumed()
                if s.protocol.eof or s.protocol.lost:
                    break
        number, length, kind, hlen = struct.unpack_from("!IIBI", got)
        error = decode_header(kind, got[13:13 + hlen])
        assert number == 0 and isinstance(error, ErrorFrame), error
        assert error.status == Status.BAD_REQUEST and "exceeds the limit" in error.message
        s.abort()
        conn = await Conn.open(cluster.nodes[0].endpoint)
        assert (await conn.apply(spec("mux/survivor"))).status == Status.OK
        assert (await wait_appendable(cluster.nodes[0].endpoint, "mux/survivor")).status == Status.OK
        assert (await conn.append("mux/survivor", [b"still replicating"])).status == Status.OK
        await conn.close()
        for n in cluster.nodes:
            assert n.proc is not None and n.proc.poll() is None, cluster.tail(n)


async def test_a_peer_that_does_not_multiplex_gets_a_connection_per_stream(tmp_path) -> None:  # noqa: ANN001
    """An older coordinator (a rolling upgrade) ignores Hello.mux and serves one stream
    per connection: the primary falls back to that, and does not ask again for a while."""
    from coordinator.replicate_api import serve_replicate

    peer = _Peer(tmp_path / "peer")
    hellos: list[bool] = []

    async def accept(conn: FrameStream) -> None:  # what server.py did before the mux
        try:
            hello = (await conn.read()).message
            hellos.append(hello.mux)
            await conn.send(HelloAck(process_id=PEER))
            first = (await conn.read()).message
            assert isinstance(first, ReplicateProposal)
            await serve_replicate(peer, conn, first)
        except ConnectionError:
            pass
        except ProtocolError:
            pass  # (the primary hung up on the mux attempt)
        finally:
            conn.abort()

    server = await serve_frames(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    peer.route = Route(members=(ME, PEER), primary=0, endpoints=("127.0.0.1:1", f"127.0.0.1:{port}"))
    peer.header = Header(route=peer.route, etcd=Etcd(revision=1))
    pool = MuxPool(REPLICATE_ACK)
    try:
        plns = [await _pipeline(peer, pool, f"mux/old{i}", tmp_path) for i in range(3)]
        for pln in plns:
            await _append(pln, b"over its own connection")
            assert isinstance(pln._streams[0], FrameStream)
        assert hellos == [True, False, False, False], hellos  # asked once, then plain
        assert not pool.connections()
        for pln in plns:
            await pln.close()
    finally:
        pool.close()
        server.close()
        await server.wait_closed()


async def test_closing_with_a_ticket_whose_waiter_was_cancelled(tmp_path) -> None:  # noqa: ANN001
    """At shutdown the coordinator cancels its connection handlers, an append's among
    them, and the ticket future that append awaited is cancelled with it; tearing the
    pipeline down then waited on that future and raised CancelledError out of the
    coordinator's run (exit 1: a CI run, every replica stopped at once). close() takes a
    cancelled ticket as nothing left to wait for."""
    async with _serving(tmp_path) as (peer, pool):
        pln = await _pipeline(peer, pool, "mux/cancelled", tmp_path)
        pln.send_content(b"in flight")
        pln.send_proposal(pln.spool.commit_proposal())
        ticket = pln.ticket()
        ticket.cancel()  # (before the answers came: it is the one close() would wait on)
        await asyncio.wait_for(pln.close(), 20)
