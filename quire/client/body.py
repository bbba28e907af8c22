"""The content of one append: bytes, a binary file, or an async iterator of bytes.

Content is streamed in chunks of at most `wire.MAX_CHUNK` and never buffered whole.
Whether an append may be retried depends on its body: bytes can always be re-sent, a
seekable file can rewind to where it started, an async iterator can be retried only if
nothing was taken from it yet.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any, BinaryIO, Union

from protocol.wire import MAX_CHUNK

AppendData = Union[bytes, bytearray, memoryview, BinaryIO, AsyncIterable[bytes]]


class Body:
    def __init__(self, data: Any, chunk_size: int = MAX_CHUNK) -> None:
        self.chunk_size = min(chunk_size, MAX_CHUNK)
        self.started = False
        """True once any content was taken from the source."""
        self._bytes: memoryview | None = None
        self._file: BinaryIO | None = None
        self._file_start = 0
        self._aiter: AsyncIterator[bytes] | None = None
        if isinstance(data, (bytes, bytearray, memoryview)):
            self._bytes = memoryview(data).cast("B")
        elif hasattr(data, "read"):
            self._file = data
            try:
                self._file_start = data.tell() if data.seekable() else -1
            except (OSError, ValueError, AttributeError):
                self._file_start = -1
        elif hasattr(data, "__aiter__"):
            self._aiter = data.__aiter__()
        else:
            raise TypeError(f"append data must be bytes, a binary file or an async iterator "
                            f"of bytes, not {type(data).__name__}")

    def whole(self) -> memoryview | None:
        """The whole content when it is bytes of at most one chunk (taken: `started`),
        else None (stream it with `chunks()`)."""
        view = self._bytes
        if view is None or len(view) > self.chunk_size:
            return None
        self.started = True
        return view

    def rewind(self) -> bool:
        """Prepare to send the content again from its start; False if impossible."""
        if not self.started:
            return True
        if self._bytes is not None:
            self.started = False
            return True
        if self._file is not None and self._file_start >= 0:
            self._file.seek(self._file_start)
            self.started = False
            return True
        return False

    async def chunks(self) -> AsyncIterator[bytes | memoryview]:
        if self._bytes is not None:
            view = self._bytes
            for i in range(0, len(view), self.chunk_size):
                self.started = True
                yield view[i:i + self.chunk_size]
        elif self._file is not None:
            while True:
                # A thread, because a pipe (stdin) may block for as long as its writer
                # likes and the event loop has acknowledgements to read meanwhile.
                chunk = await asyncio.to_thread(self._file.read, self.chunk_size)
                self.started = True
                if not chunk:
                    return
                yield chunk
        else:
            assert self._aiter is not None
            async for item in self._aiter:
                self.started = True
                if not isinstance(item, (bytes, bytearray, memoryview)):
                    raise TypeError(f"append iterator yielded {type(item).__name__}, not bytes")
                view = memoryview(item).cast("B")
                for i in range(0, len(view), self.chunk_size):
                    yield view[i:i + self.chunk_size]
