"""One connection's receive path: the receiver's CPU per frame through FrameStream,
beside a raw read of the same bytes, in the same run — over plain TCP and over TLS.

    python -m bench.recv [--frames 20000] [--size 65536] [--repeat 3] [--json OUT]

    from bench.recv import recv_figures
    fig = recv_figures(frames=20000)   # {"plain": {...}, "tls": {...}}

A sender process (this module, `--send`) writes `frames` frames of `size` bytes back to
back on one connection; the receiver (this process, uvloop, as the coordinators run) takes
them two ways, alternating `repeat` times:

- `raw`: a BufferedProtocol that reads into one fixed buffer and only counts the bytes
  (for TLS, decryption included): what any receiver must pay;
- `frames`: FrameStream (protocol/stream.py over protocol/frame_protocol.py), decoding
  each frame and copying its payload out, as a replica or a primary does;
- `streams`: asyncio's StreamReader (`readexactly` of the prefix, then of the rest): the
  same frames the stock way. (FrameStream sat on a StreamReader until 2026-11-27, but
  decoded out of its buffer in place: one copy fewer than `readexactly`.)

Each figure is the receiver's CPU (user + sys) per frame from the first frame to the last;
`ratio` is raw's over frames' (1.0 = framing costs nothing beyond the read), `vs_streams`
streams' over frames' (above 1.0: FrameStream is cheaper). Medians of the repeats are
reported, with the spread. TLS uses the cluster's settings (protocol/tls.py,
mTLS with a local CA from tools/tls_certs.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench.common import write_json
from protocol import AppendChunk, Hello
from protocol.stream import FrameStream, serve_frames
from protocol.tls import client_context, server_context
from protocol.wire import PREFIX_SIZE, check_prefix, encode_frame_bytes
from tools.tls_certs import make_local_ca

__all__ = ["recv_figures", "main"]

RAW_BUFFER = 1 << 18


class _RawSink(asyncio.BufferedProtocol):
    """Counts the bytes read into one fixed buffer; `done` when `expect` have come."""

    def __init__(self, expect: int, done: asyncio.Future[float]) -> None:
        self.buf = memoryview(bytearray(RAW_BUFFER))
        self.expect, self.got, self.done = expect, 0, done
        self.started = 0.0
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.buf

    def buffer_updated(self, nbytes: int) -> None:
        if not self.got:
            self.started = time.process_time()
        self.got += nbytes
        if self.got >= self.expect and not self.done.done():
            self.done.set_result(time.process_time() - self.started)
            self.transport.close()  # type: ignore[union-attr]


async def _receive(kind: str, frames: int, size: int, certs: dict[str, str] | None) -> float:
    """Receiver CPU seconds for `frames` frames of `size` bytes sent by a child process."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[float] = loop.create_future()
    ssl = server_context(certs["cert"], certs["key"], certs["ca"], client_auth=True) \
        if certs else None
    if kind == "raw":
        expect = len(encode_frame_bytes(Hello())) + frames * len(
            encode_frame_bytes(AppendChunk(), bytes(size)))
        server = await loop.create_server(lambda: _RawSink(expect, done), "127.0.0.1", 0, ssl=ssl)
    elif kind == "frames":
        async def handle(stream: FrameStream) -> None:
            got = 0
            await stream.read()
            started = time.process_time()
            while got < frames:
                await stream.read()
                got += 1
                while got < frames and stream.read_buffered() is not None:
                    got += 1
            done.set_result(time.process_time() - started)
            await stream.close()

        server = await serve_frames(handle, "127.0.0.1", 0, ssl=ssl)
    else:
        async def read_streams(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await _read_one(reader)
            started = time.process_time()
            for _ in range(frames):
                await _read_one(reader)
            done.set_result(time.process_time() - started)
            writer.close()

        server = await asyncio.start_server(read_streams, "127.0.0.1", 0, ssl=ssl,
                                            limit=1 << 21)
    port = server.sockets[0].getsockname()[1]
    argv = [sys.executable, "-m", "bench.recv", "--send", str(port), "--frames",
            str(frames), "--size", str(size)]
    if certs:
        argv += ["--certs", json.dumps(certs)]
    sender = await asyncio.create_subprocess_exec(*argv)
    try:
        async with asyncio.timeout(300):
            cpu = await done
            await sender.wait()
    finally:
        if sender.returncode is None:
            sender.kill()
            await sender.wait()
        server.close()
    return cpu


async def _read_one(reader: asyncio.StreamReader) -> bytes:
    kind, hlen, plen = check_prefix(await reader.readexactly(PREFIX_SIZE))
    return await reader.readexactly(hlen + plen)


async def _send(port: int, frames: int, size: int, certs: dict[str, str] | None) -> None:
    ssl = client_context(certs["ca"], certs["cert"], certs["key"]) if certs else None
    stream = await FrameStream.connect(f"127.0.0.1:{port}", ssl=ssl)
    payload = os.urandom(size)
    stream.write(Hello())
    for i in range(frames):
        stream.write(AppendChunk(), payload)
        if i % 4 == 3:
            await stream.drain()
    stream.flush()
    await stream.drain()
    await stream.wait_readable()  # the receiver closes when it has everything
    await stream.close()


def recv_figures(frames: int = 20000, size: int = 64 << 10, repeat: int = 3) -> dict:
    import uvloop

    with tempfile.TemporaryDirectory(prefix="quire-bench-recv-") as tmp:
        ca = make_local_ca(tmp)
        certs = {"ca": ca.ca, "cert": ca.cert, "key": ca.key}
        out: dict = {"frames": frames, "size": size, "repeat": repeat,
                     "load": os.getloadavg()[0]}
        for transport, c in (("plain", None), ("tls", certs)):
            runs: dict[str, list[float]] = {"raw": [], "frames": [], "streams": []}
            for _ in range(repeat):
                for kind in runs:
                    cpu = uvloop.run(_receive(kind, frames, size, c))
                    runs[kind].append(cpu / frames * 1e6)
            ratios = [r / f for r, f in zip(runs["raw"], runs["frames"])]
            vs = [s / f for s, f in zip(runs["streams"], runs["frames"])]
            out[transport] = {
                **{f"{k}_us_per_frame": round(statistics.median(v), 1) for k, v in runs.items()},
                "ratio": round(statistics.median(ratios), 2),
                "ratio_spread": [round(min(ratios), 2), round(max(ratios), 2)],
                "vs_streams": round(statistics.median(vs), 2),
                "vs_streams_spread": [round(min(vs), 2), round(max(vs), 2)],
                "runs": {k: [round(x, 1) for x in v] for k, v in runs.items()},
            }
        return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.recv", description=__doc__.split("\n")[0])
    ap.add_argument("--frames", type=int, default=20000)
    ap.add_argument("--size", type=int, default=64 << 10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--send", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--certs", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.send is not None:
        import uvloop

        uvloop.run(_send(args.send, args.frames, args.size,
                         json.loads(args.certs) if args.certs else None))
        return
    fig = recv_figures(args.frames, args.size, args.repeat)
    for transport in ("plain", "tls"):
        f = fig[transport]
        print(f"{args.size >> 10} KiB frames, {transport:5s}: receiver CPU µs/frame raw read "
              f"{f['raw_us_per_frame']:.1f}, FrameStream {f['frames_us_per_frame']:.1f}, "
              f"asyncio streams {f['streams_us_per_frame']:.1f}; raw/FrameStream {f['ratio']} "
              f"({f['ratio_spread'][0]}–{f['ratio_spread'][1]}), streams/FrameStream "
              f"{f['vs_streams']} ({f['vs_streams_spread'][0]}–{f['vs_streams_spread'][1]})")
    print(f"load (1 min) at start: {fig['load']:.2f}")
    write_json(args.json, fig)


if __name__ == "__main__":
    main()
