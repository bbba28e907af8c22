"""A replica that leaves a route holding a tail a later epoch replaced never persists it.

On a real cluster (etcd, five coordinators each behind a pass-through proxy it
advertises, Redis, a Celery worker, a file store), made deterministic:

1. an R=3 journal [P (primary), M, X] acknowledges A at [0, a);
2. X's proxy stops forwarding towards X; an append T goes to P: P adopts its commit and
   sends it to M and X — M adopts it (and serves it), X never receives it;
3. M is SIGSTOPped, P SIGKILLed, X's link reset (X rolls back what it had): P's and M's
   leases expire, the route is rebuilt from X and two members that never held the
   journal, it synchronizes at a (X's end) and acknowledges NEW at [a, ...) under a new
   epoch — other bytes at T's offsets;
4. M is SIGCONTed: its lease is gone, it re-registers, and retires its replica of the
   journal, closing its spool — [0, a + |T|), holding T — for persistence.

Before the fix M sent that fragment for persistence at once; uploaded, the store held T
at offsets the journal acknowledged NEW at (a fork; a reader of the store could get
either). Now M
compares it with what the route holds, finds the journal's bytes differ at a, and drops
it: the store holds only fragments that agree with the journal, which reads back as
acknowledged."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import uuid

import pytest

from chaos.proxy import Fault, FaultMode, FaultProxy
from fragment_store import list_fragments, open_store
from fragment_store.codecs import decompress
from fragment_store.keys import fragment_key
from protocol import FragmentSpec, JournalSpec, ReadRequest, ReadResponse, ReadContent, Status
from protocol.fragment import Codec
from tools.services import CeleryWorkerService, free_port

from tests.coordinator.cluster import (Cluster, Conn, make_workdir, scrape_metric, until,
                                     wait_appendable)

from .workers_support import worker_env

pytestmark = pytest.mark.timeout(300)

J = "safety/replaced-tail"


async def held_at(endpoint: str, offset: int, end: int) -> bytes:
    """What a member serves of [offset, end) itself, now (non-blocking, no proxying)."""
    conn = await Conn.open(endpoint)
    out = bytearray()
    try:
        await conn.s.send(ReadRequest(journal=J, offset=offset, end_offset=end, do_not_proxy=True))
        while offset + len(out) < end:
            frame = await asyncio.wait_for(conn.s.read(), 10)
            if isinstance(frame.message, ReadResponse) and frame.message.status != Status.OK:
                break
            if isinstance(frame.message, ReadContent):
                out += frame.payload
    finally:
        await conn.close()
    return bytes(out)


def queued(redis_db) -> list[tuple[int, int]]:  # noqa: ANN001
    """Spans of the persist tasks waiting in Redis (kombu's JSON envelope)."""
    out = []
    for raw in redis_db.client.lrange("persist", 0, -1):
        body = json.loads(base64.b64decode(json.loads(raw)["body"]))
        fragment = body[1]["fragment"]
        if fragment["journal"] == J:
            out.append((fragment["begin"], fragment["end"]))
    return out


def in_store(store, span: tuple[int, int]) -> bool:  # noqa: ANN001
    """A span the worker persisted, or found covered by what the store holds."""
    frags = list_fragments(store, J)
    return any(f.begin <= span[0] and span[1] <= f.end for f in frags)


def dropped(port: int) -> float | None:
    try:
        return scrape_metric(port, "quire_stale_fragments_dropped_total")
    except OSError:
        return None


async def test_a_former_replica_never_persists_a_tail_a_later_epoch_replaced(
        etcd, etcd_root, redis_db, tmp_path) -> None:  # noqa: ANN001
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    store_url = store_dir.as_uri() + "/"
    worker = CeleryWorkerService(
        f"w{uuid.uuid4().hex[:6]}", redis_url=redis_db.url, queues=("persist", "index"),
        pool="threads", concurrency=2, env=worker_env(redis_db.url, etcd, etcd_root, None))
    c = Cluster(etcd.url, etcd_root, make_workdir())
    proxies: dict[str, FaultProxy] = {}
    metrics: dict[str, int] = {}
    conns: list[Conn] = []
    try:
        for i in range(5):
            node = c.add(f"zone-{i % 2}", f"node-{i}")
            proxies[node.suffix] = await FaultProxy(f"tail-{i}", node.endpoint).start()
            metrics[node.suffix] = free_port()
            c.extra = ["--redis", redis_db.url, "--advertise", proxies[node.suffix].endpoint,
                       "--metrics-port", str(metrics[node.suffix])]
            c.start(node)
        nodes = {n.suffix: n for n in c.nodes}
        for n in c.nodes:
            await c.wait_listening(n)
        admin = await Conn.open(c.nodes[0].endpoint)
        conns.append(admin)
        spec = JournalSpec(name=J, replication=3, fragment=FragmentSpec(
            length=1 << 20, compression_codec=Codec.NONE, stores=(store_url,)))
        assert (await admin.apply(spec)).status == Status.OK
        assert (await wait_appendable(c.nodes[0].endpoint, J, timeout=60)).status == Status.OK
        route = next(e.route for e in (await admin.list()).journals if e.spec.name == J)
        p = route.members[route.primary].suffix
        m, x = (pid.suffix for i, pid in enumerate(route.members) if i != route.primary)

        to_p = await Conn.open(nodes[p].endpoint)
        conns.append(to_p)
        first = b"acknowledged by every member\n"
        r = await to_p.append(J, [first])
        assert r.status == Status.OK, r
        a = r.commit.end

        # T reaches M's spool, not X's.
        proxies[x].set_fault(Fault(FaultMode.ONE_WAY, direction="up"))
        tail = b"T" * 200 + b"\n"
        pending = asyncio.ensure_future(to_p.append(J, [tail]))
        await until(lambda: held_at(nodes[m].endpoint, a, a + len(tail)), 30, "M to adopt T")
        assert await held_at(nodes[m].endpoint, a, a + len(tail)) == tail
        assert not pending.done()  # unacknowledged: X's acknowledgement never comes
        c.kill(nodes[m], signal.SIGSTOP)
        c.kill(nodes[p], signal.SIGKILL)
        nodes[p].proc.wait(10)
        proxies[x].set_fault(Fault(FaultMode.RESET))  # T's bytes held for X are dropped
        proxies[x].heal()
        await asyncio.wait({pending}, timeout=10)
        pending.cancel()

        # The route is rebuilt without P and M and acknowledges other bytes at T's offsets.
        assert (await wait_appendable(nodes[x].endpoint, J, timeout=90)).status == Status.OK
        to_x = await Conn.open(nodes[x].endpoint)
        conns.append(to_x)
        new = b"N" * 300 + b"\n"
        r = await to_x.append(J, [new])
        assert r.status == Status.OK and r.commit.begin == a, r
        route = next(e.route for e in (await to_x.list()).journals if e.spec.name == J)
        assert {p, m}.isdisjoint(pid.suffix for pid in route.members), route
        journal = first + new

        # M wakes, re-registers and retires its replica, closing [0, a + |T|): that
        # fragment is either dropped (counted) or, as before the fix, uploaded.
        # The worker starts only once M decided, so the persist tasks run in the order
        # they were sent: a new route rolling (and persisting) a fragment that covers
        # M's span first would hide M's upload (the index would cover it).
        c.kill(nodes[m], signal.SIGCONT)
        stale = (0, a + len(tail))
        await until(lambda: dropped(metrics[m]) or stale in queued(redis_db), 90,
                    "M's retired fragment to be dropped or sent for persistence")
        sent = queued(redis_db)
        # The persist path never gets the replaced tail (before the fix it did, at once;
        # whether the worker then uploaded it raced with the allocator giving M the
        # journal again, whose next sync cut the tail from M's disk).
        assert stale not in sent, f"M sent its replaced tail {stale} for persistence"
        worker.start()
        store = open_store(store_url)
        await until(lambda: all(in_store(store, span) for span in sent), 90,
                    f"the worker to persist {sent}")
        for f in list_fragments(store, J):
            data = decompress(f.codec, store.read_all(fragment_key(f)))
            assert data == journal[f.begin:f.end], (
                f"the store holds {f.begin}-{f.end} with bytes the journal does not have")
        assert dropped(metrics[m]) == 1
        with open(nodes[m].log_path, "rb") as log:
            assert b"disagrees with the journal" in log.read()
        got = await to_x.read(J, 0, end_offset=len(journal))
        assert got[0] == journal
    finally:
        for conn in conns:
            conn.s.abort()
        for n in c.nodes:  # a stopped process must be woken to be stopped
            if n.proc is not None and n.proc.poll() is None:
                n.proc.send_signal(signal.SIGCONT)
        c.stop_all()
        worker.close()
        for proxy in proxies.values():
            await proxy.close()
        if not os.environ.get("QUIRE_KEEP_WORKDIR"):
            shutil.rmtree(c.workdir, ignore_errors=True)
