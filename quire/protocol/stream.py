"""asyncio adapters for the frame codec: one connection = a FrameStream.

Thin IO around wire.py: read the 9-byte prefix, check limits, then `readexactly` the
rest — so a hostile peer costs at most one frame of memory.
"""

from __future__ import annotations

import asyncio
import socket
from typing import TypeVar

from .errors import ProtocolError
from .messages import ErrorFrame, Message
from .status import Status
from .wire import PREFIX_SIZE, Frame, check_prefix, decode_header, encode_frame

M = TypeVar("M", bound=Message)


class ConnectionClosed(ProtocolError):
    """The peer closed the connection (cleanly or not) between or inside frames."""


class FrameStream:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        sock = writer.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    @classmethod
    async def connect(cls, endpoint: str, timeout: float = 10.0) -> FrameStream:
        host, _, port = endpoint.rpartition(":")
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host or "127.0.0.1", int(port), limit=1 << 21), timeout)
        return cls(reader, writer)

    @property
    def peer(self) -> str:
        peer = self.writer.get_extra_info("peername")
        return f"{peer[0]}:{peer[1]}" if peer else "?"

    async def read(self) -> Frame:
        try:
            prefix = await self.reader.readexactly(PREFIX_SIZE)
            kind, hlen, plen = check_prefix(prefix)
            body = await self.reader.readexactly(hlen + plen)
        except asyncio.IncompleteReadError as exc:
            raise ConnectionClosed("connection closed by peer") from exc
        except ConnectionError as exc:
            raise ConnectionClosed(str(exc) or type(exc).__name__) from exc
        view = memoryview(body)
        return Frame(decode_header(kind, view[:hlen]), view[hlen:] if plen else b"")

    async def read_message(self, expect: type[M] | tuple[type, ...]) -> tuple[M, memoryview | bytes]:
        frame = await self.read()
        if isinstance(frame.message, ErrorFrame):
            raise ProtocolError(f"peer error {frame.message.status.name}: {frame.message.message}")
        if not isinstance(frame.message, expect):
            raise ProtocolError(f"expected {expect}, got {type(frame.message).__name__}")
        return frame.message, frame.payload  # type: ignore[return-value]

    def write(self, message: Message, payload: bytes | memoryview = b"") -> None:
        self.writer.writelines(encode_frame(message, payload))

    async def send(self, message: Message, payload: bytes | memoryview = b"") -> None:
        self.write(message, payload)
        await self.drain()

    async def drain(self) -> None:
        try:
            await self.writer.drain()
        except ConnectionError as exc:
            raise ConnectionClosed(str(exc) or type(exc).__name__) from exc

    async def send_error(self, message: str, status: Status = Status.BAD_REQUEST) -> None:
        try:
            await asyncio.wait_for(self.send(ErrorFrame(status=status, message=message[:1000])), 1.0)
        except (ProtocolError, asyncio.TimeoutError, OSError):
            pass

    async def close(self) -> None:
        self.writer.close()
        try:
            await asyncio.wait_for(self.writer.wait_closed(), 1.0)
        except (OSError, asyncio.TimeoutError):
            pass

    def abort(self) -> None:
        transport = self.writer.transport
        if transport is not None:
            transport.abort()
