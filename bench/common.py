"""What the benchmark scripts share: coordinator processes, the handshake, JSON output.

Coordinators run as `python -m coordinator.main` subprocesses: bench is a top-level
tool and never imports the roles.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from typing import Any

from protocol import AppendChunk, AppendCommit, AppendRequest, AppendResponse, Hello, HelloAck
from protocol.stream import FrameStream

__all__ = ["coordinator_argv", "cpu_snapshot", "hello", "hello_when_up", "stop_processes",
           "write_json"]


def coordinator_argv(*, zone: str, suffix: str, listen: str, etcd_url: str, root: str,
                     spool_dir: str, extra: Iterable[str] = ()) -> list[str]:
    """The command line of one bench coordinator (WARNING-level JSON logs)."""
    return [sys.executable, "-m", "coordinator.main", "--zone", zone, "--id", suffix,
            "--listen", listen, "--etcd", etcd_url, "--root", root,
            "--spool-dir", spool_dir, "--log-level", "WARNING",
            "--log-format", "json", *extra]


def cpu_seconds(pid: int) -> float:
    """user + sys CPU of a process so far (Linux /proc; 0.0 elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def cpu_snapshot(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of each named process, and of this one as "client"."""
    out = {name: cpu_seconds(pid) for name, pid in pids.items()}
    t = os.times()
    out["client"] = t.user + t.system
    return out


def stop_processes(procs: Iterable[subprocess.Popen]) -> None:
    """SIGTERM every process, then wait up to 15 s for each (SIGKILL if it lingers)."""
    procs = list(procs)
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()


async def hello(endpoint: str, *, ssl: Any = None, token: str = "") -> FrameStream:
    """A connection to `endpoint` past the Hello / HelloAck handshake."""
    s = await FrameStream.connect(endpoint, timeout=10.0, ssl=ssl)
    await s.send(Hello(token=token))
    await s.read_message(HelloAck)
    return s


async def append_once(s: FrameStream, journal: str, data: bytes,
                      request: AppendRequest | None = None) -> AppendResponse:
    """One whole append (request, content, commit) on a raw connection."""
    s.write(request if request is not None else AppendRequest(journal=journal))
    if data:
        s.write(AppendChunk(), data)
    s.write(AppendCommit())
    await s.drain()
    msg, _ = await s.read_message(AppendResponse)
    return msg


async def drive(streams: list[FrameStream], journal: str, data: bytes,
                seconds: float, *, producer: str = "", close: bool = True) -> tuple[int, float]:
    """Appends of `data` back to back on every stream for `seconds`, then closes them
    (unless `close` is False): (appends acknowledged, elapsed seconds). A refused append
    ends the run. `producer`: exactly-once identified appends, one producer per stream
    (`<producer>-<i>`, a generation per call, history 1, txn 1, 2, ...)."""
    count = 0
    stop = time.monotonic() + seconds
    generation = time.time_ns()  # a new generation per call: always the newest

    async def worker(i: int, s: FrameStream) -> None:
        nonlocal count
        txn = 0
        while time.monotonic() < stop:
            req = None
            if producer:
                txn += 1
                req = AppendRequest(journal=journal, producer=f"{producer}-{i}",
                                    generation=generation, history=1, txn=txn)
            r = await append_once(s, journal, data, req)
            if r.status.name != "OK":
                raise RuntimeError(f"{journal}: append failed: {r.status.name} {r.message}")
            count += 1

    t0 = time.monotonic()
    async with asyncio.TaskGroup() as tg:
        for i, s in enumerate(streams):
            tg.create_task(worker(i, s))
    elapsed = time.monotonic() - t0
    if close:
        for s in streams:
            await s.close()
    return count, elapsed


async def hello_when_up(endpoint: str, timeout: float = 30.0) -> FrameStream:
    """`hello(endpoint)`, retried while the coordinator is still starting (OSError)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await hello(endpoint)
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)  # the coordinator is starting


def write_json(path: str | None, result: Any) -> None:
    """Write `result` to `path` (indented JSON); nothing when no path was asked for."""
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=2)
