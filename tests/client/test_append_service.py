"""AppendService: batching, per-journal order, backpressure, spill and drain."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import pytest

from quire.client import AppendService, Client, ServiceClosed
from protocol import errors

from .fakebroker import FakeBroker, running

pytestmark = pytest.mark.timeout(60)


async def test_small_appends_are_batched_and_ordered_per_journal() -> None:
    async with running() as broker:
        broker.create("a/journal")
        broker.create("b/journal")
        async with Client([broker.endpoint]) as client:
            async with AppendService(client) as svc:
                futures = []
                for i in range(500):
                    for journal in ("a/journal", "b/journal"):
                        futures.append(await svc.append(journal, f"{journal}:{i}\n".encode()))
                await svc.flush()
                results = [f.result() for f in futures]
            for journal in ("a/journal", "b/journal"):
                lines = bytes(broker.content[journal]).decode().splitlines()
                assert lines == [f"{journal}:{i}" for i in range(500)]
            # Far fewer transactions than messages.
            assert len(broker.appends) < 100
            # Each message's future names its own span.
            first = results[0]
            assert broker.content["a/journal"][first.begin:first.end] == b"a/journal:0\n"
            last_b = results[-1]
            assert broker.content["b/journal"][last_b.begin:last_b.end] == b"b/journal:499\n"


async def test_batches_respect_max_batch_bytes() -> None:
    async with running() as broker:
        broker.create("c/journal")
        async with Client([broker.endpoint]) as client:
            svc = AppendService(client, max_batch_bytes=100)
            for i in range(50):
                await svc.append("c/journal", b"x" * 9 + b"\n")
            await svc.close()
            assert all(len(body) <= 100 for _, body in broker.appends)
            assert len(broker.content["c/journal"]) == 500


async def test_memory_is_bounded_by_backpressure() -> None:
    async with running() as broker:
        broker.create("d/journal")
        async with Client([broker.endpoint]) as client:
            svc = AppendService(client, max_buffered_bytes=1000, max_batch_bytes=200)
            peak = 0
            for _ in range(200):
                await svc.append("d/journal", b"y" * 49 + b"\n")
                peak = max(peak, svc.memory)
            await svc.close()
            assert peak <= 1000
            assert len(broker.content["d/journal"]) == 200 * 50


async def test_refused_batches_fail_their_futures_and_others_continue() -> None:
    async with running() as broker:
        broker.create("ok/journal")
        async with Client([broker.endpoint]) as client:
            async with AppendService(client) as svc:
                bad = await svc.append("missing/journal", b"lost\n")
                good = await svc.append("ok/journal", b"kept\n")
                await svc.flush()
            with pytest.raises(errors.JournalNotFound):
                bad.result()
            assert good.result().end == 5


async def test_commit_unknown_is_resent_at_least_once_and_counted() -> None:
    # The documented default (Gazette's AppendService): a batch whose outcome is unknown
    # is appended again, so it may land twice — and every such re-send is counted.
    async with running() as broker:
        broker.create("alo/journal")
        broker.drop_after_commit = 1  # the first attempt lands, its answer is lost
        async with Client([broker.endpoint]) as client:
            async with AppendService(client) as svc:
                fut = await svc.append("alo/journal", b"msg\n")
                await svc.flush(timeout=10)
            assert fut.result().end - fut.result().begin == 4
            assert svc.commit_unknown_resends == 1
            assert broker.content["alo/journal"] == b"msg\nmsg\n"


async def test_commit_unknown_fails_the_batch_when_not_at_least_once() -> None:
    async with running() as broker:
        broker.create("amo/journal")
        broker.commit_unknown_next = 1
        async with Client([broker.endpoint]) as client:
            async with AppendService(client, at_least_once=False) as svc:
                lost = await svc.append("amo/journal", b"maybe\n")
                await svc.flush(timeout=10)
                after = await svc.append("amo/journal", b"after\n")
                await svc.flush(timeout=10)
            with pytest.raises(errors.CommitUnknown):
                lost.result()
            assert after.result().begin == 6 and svc.commit_unknown_resends == 0
            assert broker.content["amo/journal"] == b"maybe\nafter\n"  # each at most once


async def test_spills_while_unreachable_and_drains_in_order(tmp_path) -> None:
    # Reserve a port, close it: the cluster is "down" until a broker binds it.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spill = tmp_path / "spill"
    client = Client([f"127.0.0.1:{port}"], retry_timeout=0.2, connect_timeout=0.5)
    svc = AppendService(client, spill_dir=spill, max_buffered_bytes=4096, max_batch_bytes=512,
                        attempt_timeout=0.2, max_backoff=0.2)
    futures = [await svc.append("spill/journal", f"m{i:04d}\n".encode()) for i in range(2000)]
    # 12 KB of messages went through a 4 KB memory budget: the rest is on disk.
    assert svc.memory <= 4096
    files = list((spill / "spill%2Fjournal").glob("*.batch"))
    assert files, "nothing was spilled"
    assert not any(f.done() for f in futures)

    broker = FakeBroker()
    broker.create("spill/journal")
    await broker.start(port)
    try:
        await svc.flush(timeout=30)
        assert all(f.done() and f.exception() is None for f in futures)
        lines = bytes(broker.content["spill/journal"]).decode().splitlines()
        assert lines == [f"m{i:04d}" for i in range(2000)]
        assert not list(spill.rglob("*.batch"))
    finally:
        await svc.close()
        await client.close()
        await broker.stop()


async def test_spilled_batches_survive_a_restart_of_the_writer(tmp_path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spill = tmp_path / "spill"
    client = Client([f"127.0.0.1:{port}"], retry_timeout=0.1, connect_timeout=0.5)
    svc = AppendService(client, spill_dir=spill, attempt_timeout=0.1, max_backoff=0.2)
    futures = [await svc.append("restart/journal", f"r{i}\n".encode()) for i in range(10)]
    await asyncio.sleep(0.3)  # let the writer fail once and spill
    await svc.close(timeout=0.1)
    await client.close()
    for f in futures:
        with pytest.raises(ServiceClosed):
            f.result()
    assert list(spill.rglob("*.batch"))

    async with running(port=port) as broker:
        broker.create("restart/journal")
        async with Client([broker.endpoint]) as client2:
            async with AppendService(client2, spill_dir=spill) as svc2:
                await svc2.append("restart/journal", b"after\n")
                await svc2.flush(timeout=10)
        lines = bytes(broker.content["restart/journal"]).decode().splitlines()
        assert lines == [f"r{i}" for i in range(10)] + ["after"]
        assert not list(spill.rglob("*.batch"))


async def test_messages_queued_during_an_unknown_outcome_go_in_a_new_batch() -> None:
    # The re-sent batch carries exactly its first attempt's bytes; later messages wait
    # for the next batch (a sent batch is frozen, even while it waits to be re-sent).
    async with running() as broker:
        broker.create("frozen/journal")
        broker.commit_unknown_next = 1
        broker.lost_outcomes_land = False
        async with Client([broker.endpoint]) as client:
            async with AppendService(client, max_backoff=0.5) as svc:
                first = await svc.append("frozen/journal", b"one\n")
                while not svc.commit_unknown_resends:
                    await asyncio.sleep(0.005)
                second = await svc.append("frozen/journal", b"two\n")
                await svc.flush(timeout=10)
            assert (first.result().begin, second.result().begin) == (0, 4)
            assert [body for _, body in broker.appends] == [b"one\n", b"two\n"]


_MSG = b"x" * 1023 + b"\n"


@contextlib.asynccontextmanager
async def _up_to_the_yield() -> AsyncIterator[tuple[FakeBroker, AppendService, list]]:
    """A service that has accepted exactly YIELD_BYTES of 1 KiB messages (their futures)
    to y/journal without yielding: its next append() yields before accepting."""
    from quire.client.append_service import YIELD_BYTES

    async with running() as broker:
        broker.create("y/journal")
        async with Client([broker.endpoint]) as client:
            async with AppendService(client) as svc:
                yield broker, svc, [await svc.append("y/journal", _MSG)
                                    for _ in range(YIELD_BYTES // len(_MSG))]


async def test_a_producer_that_awaits_nothing_else_lets_the_writer_send() -> None:
    """append() yields to the loop once YIELD_BYTES were accepted (before it accepts the
    next message): a tight producer loop does not hold its first batch back until it
    stops producing."""
    async with _up_to_the_yield() as (broker, svc, futures):
        n = len(futures)
        q = svc._journals["y/journal"]  # noqa: SLF001
        assert len(q.batches) == 1 and not q.batches[0].in_flight  # no yield yet
        futures.append(await svc.append("y/journal", _MSG))  # yields, then accepts
        assert len(q.batches[0].waiters) == n and q.batches[0].in_flight  # taken by the writer
        futures += [await svc.append("y/journal", _MSG) for _ in range(10)]
        assert len(q.batches) == 2  # later messages wait in the next batch
        await svc.flush()
        assert [f.result().end for f in futures] == [(i + 1) * len(_MSG)
                                                     for i in range(len(futures))]
    assert bytes(broker.content["y/journal"]) == _MSG * len(futures)


async def test_an_append_cancelled_while_it_yields_accepts_nothing() -> None:
    async with _up_to_the_yield() as (broker, svc, futures):
        n = len(futures)
        late = asyncio.ensure_future(svc.append("y/journal", b"never\n"))
        await asyncio.sleep(0)  # `late` runs up to its yield
        late.cancel()
        with pytest.raises(asyncio.CancelledError):
            await late
        await svc.flush()
        assert [f.result().end for f in futures][-1] == n * len(_MSG)
    assert bytes(broker.content["y/journal"]) == _MSG * n
