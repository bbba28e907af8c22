"""A tiny real FetchFragment server for worker tests.

It listens on a loopback TCP port (a real socket, in its own thread and event loop)
and serves the bytes of registered fragments exactly as a coordinator replica does:
Hello -> HelloAck, FetchFragmentRequest -> FetchFragmentResponse + FragmentContent*
+ an empty FragmentContent. Knobs model real conditions: `rate` (bytes/s, a slow disk
or link), `cut_after` (the connection drops after N bytes, a crashing replica).
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from dataclasses import dataclass, field

from protocol import (
    FetchFragmentRequest,
    FetchFragmentResponse,
    Fragment,
    FragmentContent,
    Hello,
    HelloAck,
    Status,
)
from protocol.stream import FrameStream, serve_frames

CHUNK = 64 * 1024


def make_fragment(journal: str, begin: int, data: bytes, codec: str = "none") -> Fragment:
    return Fragment(journal=journal, begin=begin, end=begin + len(data),
                    sum=hashlib.sha1(data).hexdigest(), codec=codec)


@dataclass
class FragmentServer:
    rate: int = 0
    cut_after: int | None = None
    fragments: dict[tuple[str, int, int], bytes] = field(default_factory=dict)
    requests: int = 0
    bytes_served: int = 0
    port: int = 0

    def add(self, fragment: Fragment, data: bytes) -> None:
        self.fragments[(fragment.journal, fragment.begin, fragment.end)] = data

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> FragmentServer:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._server = self._loop.run_until_complete(
                serve_frames(self._handle, "127.0.0.1", 0))
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="fragment-server", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fragment server did not start")
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return

        async def close() -> None:
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _handle(self, stream: FrameStream) -> None:
        try:
            await stream.read_message(Hello)
            await stream.send(HelloAck())
            req, _ = await stream.read_message(FetchFragmentRequest)
            self.requests += 1
            f = req.fragment
            data = self.fragments.get((f.journal, f.begin, f.end))
            if data is None:
                await stream.send(FetchFragmentResponse(status=Status.JOURNAL_NOT_FOUND,
                                                        message="fragment is not local"))
                return
            await stream.send(FetchFragmentResponse())
            sent = 0
            loop = asyncio.get_running_loop()
            started = loop.time()
            for i in range(0, len(data), CHUNK):
                piece = data[i:i + CHUNK]
                if self.cut_after is not None and sent + len(piece) > self.cut_after:
                    stream.abort()  # a replica dying mid-stream
                    return
                await stream.send(FragmentContent(), piece)
                sent += len(piece)
                self.bytes_served += len(piece)
                if self.rate:
                    ahead = sent / self.rate - (loop.time() - started)
                    if ahead > 0:
                        await asyncio.sleep(ahead)
            await stream.send(FragmentContent())
        except Exception:  # noqa: BLE001 - the client went away; nothing to clean up
            pass
        finally:
            await stream.close()
