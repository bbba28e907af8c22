"""A read through a coordinator outside the journal's route, of content that only the
store holds: the member hands the proxy a fragment URL (it was asked `do_not_proxy`) and
ends its RPC; the proxy streams that fragment from the store itself and asks the member
again from its end. Real coordinators, Celery worker, Redis, etcd and S3."""

from __future__ import annotations

import asyncio
import os

from fragment_store import CoverSet
from protocol import FragmentSpec, JournalSpec, ListFragmentsRequest, ListFragmentsResponse
from quire.client.client import Client
from tests.coordinator.cluster import Conn
from tools.services import free_port

from .test_workers_e2e import until
from .workers_support import appendable, coordinator, s3_url

J = "acme/proxied/part-000"


async def test_read_of_persisted_content_through_a_non_member(
        start_worker, env, etcd, etcd_root, s3_bucket, redis_db, tmp_path) -> None:
    url = s3_url(s3_bucket, "proxy/")
    s3_env = {k: v for k, v in env.items() if k.startswith("QUIRE_S3")}
    ports = {name: free_port() for name in ("a", "b")}
    coords = [coordinator(f"coord-{n}", etcd=etcd, root=etcd_root, redis_url=redis_db.url,
                          spool_dir=str(tmp_path / f"spool-{n}"), port=p, env=s3_env)
              for n, p in ports.items()]
    for c in coords:
        c.start()
    qc = Client([f"127.0.0.1:{p}" for p in ports.values()], retry_timeout=30)
    try:
        await qc.apply([JournalSpec(name=J, replication=1, fragment=FragmentSpec(
            length=1024, compression_codec="gzip", stores=(url,), refresh_interval=1.0))])
        await until(lambda: appendable(qc, J), 30, "the journal to accept appends")
        start_worker(queues=("persist", "index"))
        a, b = os.urandom(3000), os.urandom(3000)
        ra = await qc.append(J, a)
        rb = await qc.append(J, b)  # rolls a's fragment, which the worker persists
        await until(lambda: _persisted(redis_db), 60, "the first fragment in the index")

        async def dropped() -> bool:  # the member serves a only from the store now
            infos = await qc.list_fragments(J)
            return any(i.spec.begin == ra.begin and not i.local for i in infos)
        await until(dropped, 30, "the member's local copy to be dropped")

        entry = next(e for e in await qc.list_journals() if e.spec.name == J)
        member = entry.route.members[entry.route.primary].suffix
        outsider = next(p for n, p in ports.items() if f"coord-{n}" != member)
        conn = await Conn.open(f"127.0.0.1:{outsider}")
        try:
            for _ in range(2):  # and the connection carries on
                data, metas = await asyncio.wait_for(conn.read(J, 0, end_offset=rb.end), 30)
                assert data == a + b, [(m.offset, m.fragment_url[:30]) for m in metas]
            await conn.s.send(ListFragmentsRequest(journal=J))
            listing, _ = await asyncio.wait_for(conn.s.read_message(ListFragmentsResponse), 30)
            assert [(f.spec.begin, f.spec.end) for f in listing.fragments][:1] == [(0, ra.end)]
        finally:
            await conn.close()
    finally:
        await qc.close()
        for c in coords:
            c.close()


def _persisted(redis_db) -> bool:  # type: ignore[no-untyped-def]
    raw = redis_db.client.get(f"quire:index:{J}")
    return bool(raw) and len(CoverSet.from_json(raw)) >= 1
