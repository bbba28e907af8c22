"""FrameProtocol: the read buffer a transport (or TLS) writes into, and the frames
FrameStream decodes out of it — split anywhere, slid, grown, paused and shrunk."""

from __future__ import annotations

import asyncio
import os

import pytest
import uvloop
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import messages as m
from protocol.frame_protocol import KEEP_BIG, READ_ROOM, SHRINK_ABOVE, FrameProtocol
from protocol.stream import FrameStream, serve_frames
from protocol.tls import client_context, server_context
from protocol.wire import encode_frame_bytes
from tools.tls_certs import make_local_ca


class _Transport:
    """Records what the protocol asks of its transport."""

    def __init__(self) -> None:
        self.paused = False
        self.pauses = 0

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def pause_reading(self) -> None:
        self.paused, self.pauses = True, self.pauses + 1

    def resume_reading(self) -> None:
        self.paused = False

    def is_closing(self) -> bool:
        return False


def _deliver(protocol: FrameProtocol, data: bytes, cuts: list[int]) -> None:
    """`data` as reads of the given sizes (the rest in one), each into get_buffer's view."""
    pos = 0
    for size in [*cuts, len(data)]:
        piece = data[pos:pos + size]
        if not piece:
            break
        view = protocol.get_buffer(len(piece))
        assert len(view) >= len(piece)
        view[:len(piece)] = piece
        protocol.buffer_updated(len(piece))  # (the view is still alive, as in uvloop)
        del view
        pos += len(piece)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.sampled_from([0, 1, 100, READ_ROOM - 20, READ_ROOM, 3 * READ_ROOM + 7]),
                      min_size=1, max_size=6),
       cuts=st.lists(st.integers(1, 5 * READ_ROOM), max_size=12),
       take_every=st.integers(1, 4))
def test_frames_split_anywhere_come_out_whole(sizes: list[int], cuts: list[int],
                                              take_every: int) -> None:
    payloads = [os.urandom(n) for n in sizes]
    data = b"".join(encode_frame_bytes(m.AppendChunk(), p) for p in payloads)
    protocol = FrameProtocol()
    protocol.connection_made(_Transport())  # type: ignore[arg-type]
    stream = FrameStream(protocol)
    got: list[bytes] = []
    for i, cut in enumerate([*cuts, len(data)]):
        _deliver(protocol, data[:cut], [])
        data = data[cut:]
        if i % take_every == 0:  # the reader sometimes lags several reads behind
            while (frame := stream.read_buffered()) is not None:
                got.append(bytes(frame.payload))
        if not data:
            break
    while (frame := stream.read_buffered()) is not None:
        got.append(bytes(frame.payload))
    assert got == payloads
    assert protocol.buffered == 0


def test_reading_pauses_over_twice_the_limit_and_resumes_when_consumed() -> None:
    transport = _Transport()
    protocol = FrameProtocol(limit=READ_ROOM)
    protocol.connection_made(transport)  # type: ignore[arg-type]
    frame = encode_frame_bytes(m.AppendChunk(), b"x" * 1000)
    while not transport.paused:
        assert protocol.buffered <= 2 * READ_ROOM
        _deliver(protocol, frame, [])
    assert transport.pauses == 1
    stream = FrameStream(protocol)
    while protocol.buffered > READ_ROOM:
        assert transport.paused
        assert stream.read_buffered() is not None
    assert not transport.paused


def test_an_empty_buffer_that_grew_for_a_large_frame_shrinks_once_they_stop() -> None:
    protocol = FrameProtocol()
    protocol.connection_made(_Transport())  # type: ignore[arg-type]
    big = encode_frame_bytes(m.AppendChunk(), os.urandom(1 << 20)) * 3
    _deliver(protocol, big, [1000])
    assert len(protocol.buf) > SHRINK_ABOVE
    stream = FrameStream(protocol)
    assert [len(stream.read_buffered().payload) for _ in range(3)] == [1 << 20] * 3  # type: ignore[union-attr]
    small = encode_frame_bytes(m.AppendCommit())
    for _ in range(KEEP_BIG):  # kept while large frames may still be coming...
        _deliver(protocol, small, [])
        assert stream.read_buffered() is not None and len(protocol.buf) > SHRINK_ABOVE
    protocol.get_buffer(-1)  # ...and given back after KEEP_BIG emptyings without one
    assert len(protocol.buf) == READ_ROOM


def test_a_buffer_large_frames_keep_coming_to_is_not_grown_again_per_frame() -> None:
    """One large append after another, each with small frames around it, the buffer
    emptying between them (a client's connection, a replica's): the room grown for the
    first is reused, never shrunk and regrown (which zeroed and copied megabytes)."""
    protocol = FrameProtocol()
    protocol.connection_made(_Transport())  # type: ignore[arg-type]
    stream = FrameStream(protocol)
    small = encode_frame_bytes(m.AppendCommit())
    append = encode_frame_bytes(m.AppendChunk(), os.urandom(1 << 20)) + small
    buffers = []
    for _ in range(6):
        _deliver(protocol, small, [])
        assert stream.read_buffered() is not None
        _deliver(protocol, append, [1 << 18] * 3)
        assert len(stream.read_buffered().payload) == 1 << 20  # type: ignore[union-attr]
        assert stream.read_buffered() is not None and protocol.buffered == 0
        buffers.append(protocol.buf)  # (held: a freed one's id could be reused)
    assert all(b is buffers[0] for b in buffers) and len(protocol.buf) > SHRINK_ABOVE


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_large_frames_both_ways_over_tls(tmp_path, loop_kind: str) -> None:  # noqa: ANN001
    """The TLS layers (asyncio's and uvloop's) decrypt straight into the buffer."""
    ca = make_local_ca(tmp_path)
    payloads = [os.urandom(n) for n in (1, 16 << 10, (1 << 20) - 3, 65 << 10)] * 3

    async def main() -> None:
        async def echo(stream: FrameStream) -> None:
            for _ in payloads:
                frame = await stream.read()
                await stream.send(m.AppendChunk(), frame.payload)
            await stream.close()

        server = await serve_frames(echo, "127.0.0.1", 0,
                                    ssl=server_context(ca.cert, ca.key, ca.ca, client_auth=True))
        port = server.sockets[0].getsockname()[1]
        client = await FrameStream.connect(f"127.0.0.1:{port}",
                                           ssl=client_context(ca.ca, ca.cert, ca.key))
        for p in payloads:
            client.write(m.AppendChunk(), p)
        client.flush()
        for p in payloads:
            assert bytes((await asyncio.wait_for(client.read(), 10)).payload) == p
        await asyncio.wait_for(client.wait_readable(), 10)  # the server's close
        assert client.at_eof()
        await client.close()
        server.close()
        await server.wait_closed()

    if loop_kind == "uvloop":
        uvloop.run(main())
    else:
        asyncio.run(main())


def test_a_read_waits_on_the_protocols_future_one_reader_at_a_time() -> None:
    """FrameStream.read awaits the protocol's data future itself (no coroutine of the
    protocol's between): the frame arrives whole across several reads, a second reader
    while one waits is refused, and a cancelled read leaves the connection readable."""

    async def main() -> None:
        protocol = FrameProtocol()
        protocol.connection_made(_Transport())  # type: ignore[arg-type]
        stream = FrameStream(protocol)
        data = encode_frame_bytes(m.AppendChunk(), b"payload")
        first = asyncio.ensure_future(stream.read())
        await asyncio.sleep(0)  # (it waits on the protocol's future now)
        with pytest.raises(RuntimeError, match="already waiting"):
            await stream.read()
        for i in range(len(data)):  # a byte at a time: each wakes it, one frame comes out
            protocol.feed(data[i:i + 1])
            await asyncio.sleep(0)
        assert (await asyncio.wait_for(first, 5)).payload == b"payload"
        cancelled = asyncio.ensure_future(stream.read())
        await asyncio.sleep(0)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        later = asyncio.ensure_future(stream.read())  # not refused: the waiter was cancelled
        protocol.feed(encode_frame_bytes(m.AppendCommit()))
        assert isinstance((await asyncio.wait_for(later, 5)).message, m.AppendCommit)

    asyncio.run(main())


def test_reusable_means_open_with_nothing_unread() -> None:
    """The client pool's test of an idle connection (quire/client/connection.py)."""
    protocol = FrameProtocol()
    protocol.connection_made(_Transport())  # type: ignore[arg-type]
    stream = FrameStream(protocol)
    assert stream.reusable()
    protocol.feed(encode_frame_bytes(m.AppendCommit()))
    assert not stream.reusable()  # bytes nobody asked for: no answer to the next RPC
    assert stream.read_buffered() is not None and stream.reusable()
    protocol.eof_received()
    assert not stream.reusable()
    assert not FrameStream(FrameProtocol()).reusable()  # (never connected)


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_an_error_to_a_connection_already_closed_is_dropped_quietly(loop_kind: str) -> None:
    """A handler's last word after the connection went (the coordinator's `_accept`
    answering a failure): uvloop raises RuntimeError for a write to a closed handle;
    send_error says nothing instead of raising out of the handler."""

    async def main() -> None:
        said: list[BaseException | None] = []

        async def handler(stream: FrameStream) -> None:
            stream.abort()
            await asyncio.wait_for(stream.protocol.wait_closed(), 10)  # the handle is gone now
            try:
                await stream.send_error("too late")
                said.append(None)
            except BaseException as exc:  # noqa: BLE001 - the assertion reports it
                said.append(exc)

        server = await serve_frames(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = await FrameStream.connect(f"127.0.0.1:{port}")
        await asyncio.wait_for(client.wait_readable(), 10)  # the server's abort
        await client.close()
        server.close()
        await server.wait_closed()
        assert said == [None]

    if loop_kind == "uvloop":
        uvloop.run(main())
    else:
        asyncio.run(main())


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_writing_to_a_closed_connection_says_connection_closed_not_runtime_error(loop_kind: str) -> None:
    """A read relay flushing a large frame to a client already gone (chaos: a coordinator
    logged 'connection handler failed: RuntimeError ... the handler is closed' from
    drain -> flush -> uvloop's writelines): a write is dropped, and drain() and send()
    raise ConnectionClosed, the error every caller handles."""
    from protocol.stream import FLUSH_BYTES, ConnectionClosed

    async def main() -> None:
        seen: list[str] = []

        async def handler(stream: FrameStream) -> None:
            stream.abort()
            await asyncio.wait_for(stream.protocol.wait_closed(), 10)
            stream.write(m.AppendChunk(), b"x" * FLUSH_BYTES)  # flushes at once: dropped
            for op in (stream.drain, lambda: stream.send(m.AppendCommit())):
                try:
                    await op()
                    seen.append("returned")
                except ConnectionClosed:
                    seen.append("ConnectionClosed")
                except BaseException as exc:  # noqa: BLE001 - the assertion reports it
                    seen.append(repr(exc))

        server = await serve_frames(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = await FrameStream.connect(f"127.0.0.1:{port}")
        await asyncio.wait_for(client.wait_readable(), 10)
        await client.close()
        server.close()
        await server.wait_closed()
        assert seen == ["ConnectionClosed", "ConnectionClosed"], seen

    if loop_kind == "uvloop":
        uvloop.run(main())
    else:
        asyncio.run(main())
