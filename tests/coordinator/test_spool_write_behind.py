"""A spool file's write-behind (coordinator/spool_files.py): inside an event loop the
writes of one loop turn reach the file together at the turn's end; reads always see
them; and nothing is acknowledged — by a replica's answers or by the primary's
pipeline — before the bytes it covers are on file. A write that fails is raised by
the barrier, so its append is never acknowledged. Failures are real OS errors: the
file's descriptor is swapped for a read-only one (EBADF on write)."""

from __future__ import annotations

import asyncio
import os

import pytest

from coordinator.pipeline import ACK_OK_FRAME, Pipeline, PipelineBroken
from coordinator.replica import Replica
from coordinator.spool import DiskFiles, Spool
from protocol import Etcd, Header, ProcessId, Route
from protocol.stream import FrameStream

J = "a/write-behind"
ME = ProcessId(zone="z", suffix="me")
PEER = ProcessId(zone="z", suffix="peer")


def _on_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _break_writes(file) -> None:  # noqa: ANN001 - a DiskFile
    """From now on every write to `file` fails with EBADF (its fd is read-only)."""
    ro = os.open(file.path, os.O_RDONLY)
    os.dup2(ro, file._fd)  # noqa: SLF001
    os.close(ro)


async def test_one_turns_writes_reach_the_file_together_and_reads_see_them(tmp_path) -> None:  # noqa: ANN001
    files = DiskFiles(tmp_path)
    f = files.create(J, 0)
    f.write_at(0, b"abc")
    f.write_at(3, memoryview(bytearray(b"def")))  # not bytes: copied as held
    assert _on_file(f.path) == b""  # held for the end of the turn
    await asyncio.sleep(0)
    assert _on_file(f.path) == b"abcdef"
    f.write_at(6, b"gh")
    assert f.read_at(0, 100) == b"abcdefgh"  # a read writes what is held first
    f.write_at(8, b"ij")
    f.truncate(8)  # a rollback of what was never written: dropped, not written
    await asyncio.sleep(0)
    assert _on_file(f.path) == b"abcdefgh"
    f.discard()
    files.close()


def test_outside_a_loop_writes_go_down_at_once(tmp_path) -> None:  # noqa: ANN001
    files = DiskFiles(tmp_path)
    f = files.create(J, 0)
    f.write_at(0, b"now")
    assert _on_file(f.path) == b"now"
    f.discard()
    files.close()


async def test_a_failed_write_is_raised_until_it_is_cut_off(tmp_path) -> None:  # noqa: ANN001
    files = DiskFiles(tmp_path)
    spool = Spool(J, files=files)
    spool.apply_content(0, b"committed")
    spool.apply_proposal(spool.commit_proposal())
    spool.flush()
    spool.apply_content(0, b"lost")
    f = spool.file
    _break_writes(f)
    with pytest.raises(OSError):
        spool.flush()  # the acknowledgement barrier
    with pytest.raises(OSError, match="earlier write"):
        f.read_at(0, 9)  # sticky: never a read of bytes that are not there
    with pytest.raises(OSError, match="earlier write"):
        spool.flush()
    os.dup2(os.open(f.path, os.O_RDWR), f._fd)  # noqa: SLF001 - the disk is back
    spool.rollback()  # the failed bytes were the uncommitted tail: cut off, whole again
    spool.flush()
    assert spool.read_committed(0, 100) == b"committed"
    files.close()


async def test_a_replicas_answers_wait_for_its_file_and_a_failure_sends_none() -> None:
    got: list[bytes] = []

    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got.append(await reader.read())

    server = await asyncio.start_server(peer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        stream = await FrameStream.connect(f"127.0.0.1:{port}")
        order: list[str] = []
        stream.before_flush = lambda: order.append("file")
        stream.write_encoded([ACK_OK_FRAME])
        stream.flush()
        assert order == ["file"]  # the barrier ran before the answer left

        def failing() -> None:
            raise OSError(5, "Input/output error")

        stream.before_flush = failing
        stream.write_encoded([b"never sent"])
        with pytest.raises(OSError):
            stream.flush()
        async with asyncio.timeout(10):
            while not got:
                await asyncio.sleep(0.01)
        assert got == [ACK_OK_FRAME]  # the connection was cut, the second answer unsent
        await stream.close()
    finally:
        server.close()
        await server.wait_closed()


async def _pipeline(tmp_path, peers: int):  # noqa: ANN001, ANN202
    """A real Pipeline of a replica on disk; each peer a loopback server that answers
    every frame it reads with one plain acknowledgement."""
    async def acker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(1 << 16):
            writer.write(ACK_OK_FRAME)

    servers, streams = [], []
    for _ in range(peers):
        server = await asyncio.start_server(acker, "127.0.0.1", 0)
        servers.append(server)
        streams.append((PEER, await FrameStream.connect(
            f"127.0.0.1:{server.sockets[0].getsockname()[1]}")))
    replica = Replica(J, DiskFiles(tmp_path))
    route = Route(members=(ME,) + (PEER,) * peers, primary=0)
    return servers, replica, Pipeline(replica, Header(route=route, etcd=Etcd(revision=1)),
                                      ME, streams)


@pytest.mark.parametrize("peers", [0, 1])
async def test_the_primary_acknowledges_only_what_reached_its_file(tmp_path, peers) -> None:  # noqa: ANN001
    servers, replica, pln = await _pipeline(tmp_path, peers)
    try:
        spool = replica.spool
        pln.send_content(b"first")
        pln.send_proposal(spool.commit_proposal())
        await pln.ticket(must_ok=True)
        assert _on_file(spool.file.path) == b"first"
        pln.send_content(b"second")
        pln.send_proposal(spool.commit_proposal())
        _break_writes(spool.file)
        with pytest.raises(PipelineBroken, match="spool write failed"):
            await pln.ticket(must_ok=True)  # its peers acknowledged; we did not write it
        assert pln.broken is not None  # and nothing rides this pipeline any more
    finally:
        await pln.close()
        for server in servers:
            server.close()
            await server.wait_closed()


def test_a_big_write_overlaps_the_hash_and_the_barriers_wait_for_it(tmp_path) -> None:  # noqa: ANN001
    from coordinator.spool_files import OVERLAP

    files = DiskFiles(tmp_path)
    spool = Spool(J, files=files)
    big = os.urandom(OVERLAP)
    spool.apply_content(0, big)  # its pwrite runs in the writer thread meanwhile
    spool.apply_proposal(spool.commit_proposal())
    assert spool.read_committed(0, OVERLAP) == big  # a read waits for it
    spool.apply_content(0, memoryview(bytearray(big)))  # (not bytes: copied first)
    spool.flush()  # the acknowledgement barrier waits for it too
    assert _on_file(spool.file.path) == big + big
    spool.apply_proposal(spool.commit_proposal())
    _break_writes(spool.file)
    spool.apply_content(0, big)  # fails in the writer thread...
    with pytest.raises(OSError):
        spool.flush()  # ...and the barrier raises it
    with pytest.raises(OSError, match="earlier write"):
        spool.read_committed(0, 10)
    spool.file.discard()
    files.close()
