"""Client against an in-process server speaking the wire protocol (see fakebroker.py)."""

from __future__ import annotations

import asyncio
import io
import socket
import time

import pytest

from quire.client import Client, SyncClient
from protocol import JournalSpec, LabelSet, errors
from protocol.wire import MAX_CHUNK

from .fakebroker import FakeBroker, running

pytestmark = pytest.mark.timeout(30)


def closed_port() -> str:
    # Bind then close: nothing listens there afterwards, so connects are refused.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


async def test_append_and_read_roundtrip() -> None:
    async with running() as broker:
        broker.create("topic/part-000")
        async with Client([broker.endpoint]) as client:
            r1 = await client.append("topic/part-000", b"hello\n")
            r2 = await client.append("topic/part-000", b"world\n")
            assert (r1.begin, r1.end, r2.begin, r2.end) == (0, 6, 6, 12)
            got = [item async for item in client.read("topic/part-000")]
            assert b"".join(d for _, d in got) == b"hello\nworld\n"
            # Offsets are contiguous and absolute.
            assert got[0][0] == 0 and all(a[0] + len(a[1]) == b[0] for a, b in zip(got, got[1:]))
            tail = [d async for _, d in client.read("topic/part-000", offset=6)]
            assert b"".join(tail) == b"world\n"
            assert await client.write_head("topic/part-000") == 12


async def test_bursts_of_concurrent_appends_reuse_their_connections() -> None:
    """As many connections as appends in flight, opened once: between bursts the pool
    keeps them all (the old max_idle of 8 closed 24 of them after each burst, and the
    next burst paid a connect and a Hello round trip on 24 appends' paths)."""
    async with running() as broker:
        broker.create("topic/pool")
        async with Client([broker.endpoint]) as client:
            async def appender() -> None:
                for _ in range(5):
                    await client.append("topic/pool", b"x")

            for _ in range(3):  # three bursts, each of 32 appends in flight
                await asyncio.gather(*(appender() for _ in range(32)))
        assert len(broker.appends) == 480
        assert broker.hellos <= 32, broker.hellos


async def test_append_streams_large_bodies_in_chunks() -> None:
    async with running() as broker:
        broker.create("big/journal")
        data = bytes(range(256)) * ((2 * MAX_CHUNK + 1000) // 256)

        async def gen():
            for i in range(0, len(data), 300_000):
                yield data[i:i + 300_000]

        async with Client([broker.endpoint]) as client:
            await client.append("big/journal", io.BytesIO(data))
            await client.append("big/journal", gen())
            assert bytes(broker.content["big/journal"]) == data + data
            # Every chunk frame respected the wire limit (the server would have refused).
            assert len(broker.appends) == 2


async def test_missing_journal_is_a_typed_error_with_status_and_journal() -> None:
    async with running() as broker:
        async with Client([broker.endpoint]) as client:
            with pytest.raises(errors.JournalNotFound) as info:
                await client.append("no/such", b"x" * (3 * MAX_CHUNK))
            assert "JOURNAL_NOT_FOUND" in str(info.value) and "no/such" in str(info.value)
            with pytest.raises(errors.JournalNotFound):
                [x async for x in client.read("no/such")]
            with pytest.raises(errors.JournalNotFound):
                await client.delete("no/such")
            # The connection survived the early answer and is reused.
            assert await client.list_journals() == []


async def test_route_cache_follows_redirect_to_primary() -> None:
    async with running(FakeBroker("a")) as a, running(FakeBroker("b")) as b:
        a.create("routed/journal")
        b.create("routed/journal")
        a.redirect_to = b.endpoint  # a claims b is the primary
        async with Client([a.endpoint]) as client:
            result = await client.append("routed/journal", b"data")
            assert result.end == 4
            assert b.content["routed/journal"] == b"data" and a.content["routed/journal"] == b""
            # The route learned from b's answer is cached: the next append goes straight to b.
            assert client.routes.for_append("routed/journal") == b.endpoint
            a.requests.clear()
            await client.append("routed/journal", b"more")
            assert a.requests == []
            # b stops being primary: WRONG_ROUTE-style refusal invalidates the cache.
            a.redirect_to, b.redirect_to = None, a.endpoint
            a.requests.clear()
            await client.append("routed/journal", b"!")
            assert a.content["routed/journal"] == b"!"


async def test_append_retries_unavailable_answers_and_dead_seeds() -> None:
    async with running() as broker:
        broker.create("retry/journal")
        broker.fail_next_appends = 2
        async with Client([closed_port(), broker.endpoint], retry_timeout=10) as client:
            await client.append("retry/journal", b"abc")
            await client.append("retry/journal", b"def")
            assert broker.content["retry/journal"] == b"abcdef"


@pytest.mark.parametrize("how", ["connection lost", "COMMIT_UNKNOWN answered"])
async def test_lost_outcome_after_the_commit_raises_commit_unknown_and_never_resends(how: str) -> None:
    # reliability.md finding 1: re-sending after the commit made records land twice.
    async with running() as broker:
        broker.create("unknown/journal")
        if how == "connection lost":
            broker.drop_after_commit = 1
        else:
            broker.commit_unknown_next = 1
        async with Client([broker.endpoint], retry_timeout=10) as client:
            with pytest.raises(errors.CommitUnknown) as info:
                await client.append("unknown/journal", b"record\n")
            err = info.value
            assert isinstance(err, errors.StatusError) and not err.retriable
            assert err.status.name == "COMMIT_UNKNOWN" and err.journal == "unknown/journal"
            assert "outcome unknown" in str(err) and "not re-sent" in str(err)
            # Sent (and here committed) exactly once: no retry after the commit.
            assert broker.appends == [("unknown/journal", b"record\n")]
            assert sum(type(r).__name__ == "AppendRequest" for r in broker.requests) == 1
            # The client is still usable, and the record was not duplicated by it.
            await client.append("unknown/journal", b"next\n")
            assert broker.content["unknown/journal"] == b"record\nnext\n"


async def test_an_unanswered_append_times_out_by_the_rpc_timeout() -> None:
    """The pool's watchdog (not a timer per append) ends a wait for an answer that never
    comes: after rpc_timeout, within its period, as an outcome unknown (the commit was
    sent); the connection is closed, the client goes on."""
    async with running() as broker:
        broker.create("hung/journal")
        broker.silent_next = 1
        async with Client([broker.endpoint], rpc_timeout=0.4, retry_timeout=10) as client:
            started = time.monotonic()
            with pytest.raises(errors.CommitUnknown, match="did not answer within 0.4s"):
                await client.append("hung/journal", b"record\n")
            assert 0.4 <= time.monotonic() - started < 2.0
            assert (await client.append("hung/journal", b"next\n")).end > 0
            assert not client.pool._watched  # noqa: SLF001 - nothing left watched


async def test_lost_outcome_with_explicit_offset_is_retried_at_that_offset() -> None:
    async with running() as broker:
        broker.create("offset/journal")
        async with Client([broker.endpoint], retry_timeout=10) as client:
            await client.append("offset/journal", b"abc")  # offset 0 asserts nothing
            # The lost attempt did not land: the retry at the same offset commits it once.
            broker.drop_after_commit, broker.lost_outcomes_land = 1, False
            r = await client.append("offset/journal", b"de", offset=3)
            assert (r.begin, r.end) == (3, 5) and broker.content["offset/journal"] == b"abcde"
            # The lost attempt did land: the retry at offset 5 is refused (the head moved,
            # by us or by another writer), so the outcome stays unknown — never twice.
            broker.drop_after_commit, broker.lost_outcomes_land = 1, True
            with pytest.raises(errors.CommitUnknown) as info:
                await client.append("offset/journal", b"fg", offset=5)
            assert "WRONG_APPEND_OFFSET" in str(info.value)
            assert broker.content["offset/journal"] == b"abcdefg"
            broker.commit_unknown_next = 1
            with pytest.raises(errors.CommitUnknown):
                await client.append("offset/journal", b"hi", offset=7)
            assert broker.content["offset/journal"] == b"abcdefghi"


async def test_unreachable_cluster_is_unavailable_within_the_deadline() -> None:
    async with Client([closed_port()], retry_timeout=0.5) as client:
        with pytest.raises(errors.Unavailable) as info:
            await client.list_journals()
        assert info.value.status.name == "UNAVAILABLE"
        with pytest.raises(errors.Unavailable):
            await client.append("some/journal", b"x")


async def test_explicit_offset_and_wrong_offset() -> None:
    async with running() as broker:
        broker.create("off/journal")
        async with Client([broker.endpoint]) as client:
            await client.append("off/journal", b"12345", offset=0)
            await client.append("off/journal", b"678", offset=5)
            with pytest.raises(errors.WrongAppendOffset):
                await client.append("off/journal", b"9", offset=3)
            head = await client.reset_head("off/journal")
            assert head.begin == 8


async def test_blocking_follow_sees_new_appends() -> None:
    async with running() as broker:
        broker.create("tail/journal")
        async with Client([broker.endpoint]) as client:
            await client.append("tail/journal", b"one\n")
            seen = bytearray()
            reader = client.read("tail/journal", follow=True)

            async def consume() -> None:
                async for _, data in reader:
                    seen.extend(data)
                    if seen.endswith(b"two\n"):
                        return

            task = asyncio.create_task(consume())
            await asyncio.sleep(0.1)
            await client.append("tail/journal", b"two\n")
            await asyncio.wait_for(task, 5)
            await reader.aclose()
            assert bytes(seen) == b"one\ntwo\n"


async def test_end_offset_and_offset_minus_one() -> None:
    async with running() as broker:
        broker.create("end/journal")
        async with Client([broker.endpoint]) as client:
            await client.append("end/journal", b"0123456789abcdef")
            part = b"".join([d async for _, d in client.read("end/journal", 3, end_offset=12)])
            assert part == b"3456789ab"
            assert [x async for x in client.read("end/journal", -1)] == []


async def test_list_apply_delete_fragments_brokers() -> None:
    async with running() as broker:
        async with Client([broker.endpoint]) as client:
            rev = await client.apply([JournalSpec(name="a/one", replication=1,
                                                  labels=LabelSet.of(topic="a"))])
            assert rev > 0
            await client.apply([JournalSpec(name="b/two", replication=1)])
            names = [e.spec.name for e in await client.list_journals("topic=a")]
            assert names == ["a/one"]
            assert len(await client.list_journals()) == 2
            await client.delete("a/one")
            assert [e.spec.name for e in await client.list_journals()] == ["b/two"]
            assert await client.list_fragments("b/two") == []
            brokers = await client.list_brokers()
            assert brokers[0].endpoint == broker.endpoint


def test_sync_client_facade() -> None:
    loop = asyncio.new_event_loop()
    broker = FakeBroker()
    # The fake broker runs on its own loop thread, the SyncClient on another.
    import threading

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(broker.start(), loop).result(5)
    try:
        broker.create("sync/journal")
        with SyncClient([broker.endpoint]) as client:
            assert client.append("sync/journal", b"abc").end == 3
            assert client.read_all("sync/journal") == b"abc"
            assert [e.spec.name for e in client.list_journals()] == ["sync/journal"]
            with pytest.raises(errors.JournalNotFound):
                client.append("sync/missing", b"x")
            client.wait_writable(["sync/journal"], timeout=5)
            assert client.read_all("sync/journal") == b"abc"  # the probe appends nothing
            with pytest.raises(errors.JournalNotFound):
                client.wait_writable(["sync/journal", "sync/missing"], timeout=0.5)
    finally:
        asyncio.run_coroutine_threadsafe(broker.stop(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


async def test_from_store_reads_persisted_fragments_directly(tmp_path) -> None:
    import hashlib

    from fragment_store import compress, fragment_key
    from fragment_store.stores import open_store

    from protocol import Codec, Fragment

    store_url = (tmp_path / "store").as_uri() + "/"
    (tmp_path / "store").mkdir()
    old = b"".join(b'{"old": %d}\n' % i for i in range(100))
    frag = Fragment(journal="stored/journal", begin=0, end=len(old),
                    sum=hashlib.sha1(old).hexdigest(), codec=Codec.GZIP, backing_store=store_url)
    store = open_store(store_url)
    store.put(fragment_key(frag), compress(Codec.GZIP, old))
    async with running() as broker:
        broker.create("stored/journal")
        broker.content["stored/journal"] += old + b'{"new": 1}\n'
        broker.persisted["stored/journal"] = [(frag, store_url + fragment_key(frag))]
        async with Client([broker.endpoint]) as client:
            reader = client.read("stored/journal", offset=5, from_store=True)
            data = b"".join([d async for _, d in reader])
            assert data == (old + b'{"new": 1}\n')[5:]
            # The persisted span came from the store: the broker streamed none of it, and
            # the client's second Read started where the stored fragment ended.
            requests = [r for r in broker.requests if type(r).__name__ == "ReadRequest"]
            assert requests[0].do_not_proxy and requests[-1].offset == len(old)


def test_the_route_cache_names_its_revision_while_it_is_fresh() -> None:
    from protocol import Etcd, Header, ProcessId, Route
    from quire.client.routes import RouteCache

    routes = RouteCache(["127.0.0.1:1"], ttl=0.2)
    assert routes.revision("a/b") == 0  # nothing cached: every answer carries a header
    route = Route(members=(ProcessId(zone="z", suffix="p"),), primary=0,
                  endpoints=("127.0.0.1:2",))
    routes.update("a/b", Header(route=route, etcd=Etcd(revision=7)))
    assert routes.revision("a/b") == 7 and routes.for_append("a/b") == "127.0.0.1:2"
    routes.update("a/b", Header(route=route, etcd=Etcd(revision=9)))
    assert routes.revision("a/b") == 9  # a newer revision of the same route is taken
    at = routes._routes["a/b"][1]  # noqa: SLF001
    deadline = time.monotonic() + 5
    while time.monotonic() - at < 0.1 and time.monotonic() < deadline:
        time.sleep(0.01)
    # Past half the TTL: appends ask for the header again, and its answer renews it.
    assert routes.revision("a/b") == 0 and routes.for_append("a/b") == "127.0.0.1:2"
    routes.update("a/b", Header(route=route, etcd=Etcd(revision=9)))
    assert routes.revision("a/b") == 9 and routes._routes["a/b"][1] > at  # noqa: SLF001


async def test_a_stalled_append_follows_its_journal_to_the_new_primary() -> None:
    """An append its primary never answers (a silent socket: the primary's host cut off)
    is abandoned once another coordinator names a new primary (quire/client/reroute.py),
    long before its RPC timeout: an identified one is re-sent there at once and
    acknowledged; a plain one becomes CommitUnknown after its grace, never re-sent."""
    from quire.client import TxnId

    journal = "moved/journal"
    old, new = FakeBroker("old"), FakeBroker("new")
    async with running(old), running(new):
        old.create(journal)
        new.create(journal)
        async with Client([old.endpoint, new.endpoint], rpc_timeout=60, retry_timeout=30) as client:
            client.routes.update(journal, old.header())  # old is the primary the client knows
            old.silent_next = 1
            started = time.monotonic()
            result = await client.append(journal, b"identified\n", txn=TxnId("p", 1, 1, 1))
            assert time.monotonic() - started < 10.0  # (the rerouter: ~1-2 s; rpc_timeout 60)
            assert new.appends == [(journal, b"identified\n")] and result.end == len(b"identified\n")
            assert client.routes.primary(journal) == new.endpoint

            client.routes.update(journal, old.header())
            old.silent_next = 1
            with pytest.raises(errors.CommitUnknown, match="primary moved to"):
                await asyncio.wait_for(client.append(journal, b"plain\n"), 10.0)
            assert (journal, b"plain\n") not in new.appends  # an unknown outcome: not re-sent
            assert not client.pool._watched  # noqa: SLF001 - nothing left watched


async def test_a_stalled_append_whose_journal_did_not_move_waits_for_its_timeout() -> None:
    """Probes that name the same primary abandon nothing: the append ends by its RPC
    timeout, as before."""
    journal = "stays/journal"
    primary, other = FakeBroker("primary"), FakeBroker("other")
    async with running(primary), running(other):
        primary.create(journal)
        other.create(journal)
        other.header = primary.header  # type: ignore[method-assign] # other's view: primary leads
        async with Client([primary.endpoint, other.endpoint], rpc_timeout=2.5) as client:
            client.routes.update(journal, primary.header())
            primary.silent_next = 1
            with pytest.raises(errors.CommitUnknown, match="did not answer within 2.5s"):
                await client.append(journal, b"record\n")
            assert other.appends == []
            assert any(type(r).__name__ == "ReadRequest" for r in other.requests)  # it was asked


async def test_a_stalled_append_is_not_abandoned_when_its_journal_moves_to_where_it_went() -> None:
    """Seen in make compose-test: an append sent to coordinator A as a proxy (the primary
    B had just been killed) stalled; a probe still named B (a view behind), the next one
    named A — the coordinator the append was waiting on, now primary. The rerouter took
    that for a move and aborted it: a plain append became CommitUnknown for nothing."""
    from quire.client.reroute import Rerouter

    class Stalled:  # what the rerouter reads and writes of a watched Connection
        journal, endpoint, expect, grace = "j", "a:8080", "", 1.0
        moved_to, moved_at, rerouted = "", 0.0, ""
        since = time.monotonic() - 5.0

        def abort(self) -> None:
            aborted.append(self.endpoint)

    answers = iter(["dead-b:8080", "a:8080"])

    async def probe(journal: str, avoid: str) -> str:
        return next(answers)

    aborted: list[str] = []
    conn = Stalled()
    watched = {conn: 60.0}
    rerouter = Rerouter(probe)
    for _ in range(2):  # two probes, then past the grace
        assert rerouter.tick(time.monotonic(), watched)
        await asyncio.sleep(0.3)
    assert rerouter.tick(time.monotonic() + 5.0, watched)
    await asyncio.sleep(0)
    assert conn.expect == "a:8080" and conn.moved_to == "" and aborted == []
    assert conn in watched
    rerouter.close()


def test_the_route_cache_holds_ten_thousand_journals_by_default() -> None:
    """A client appending round-robin over 10,000 journals keeps every route (#49):
    with fewer entries every append misses and is proxied by a seed."""
    from protocol import Etcd, Header, ProcessId, Route
    from quire.client.routes import RouteCache

    routes = RouteCache(["127.0.0.1:1"])
    route = Route(members=(ProcessId(zone="z", suffix="p"),), primary=0,
                  endpoints=("127.0.0.1:2",))
    names = [f"many/j-{i:05d}" for i in range(10_000)]
    for name in names:
        routes.update(name, Header(route=route, etcd=Etcd(revision=3)))
    assert all(routes.for_append(n) == "127.0.0.1:2" for n in names)
