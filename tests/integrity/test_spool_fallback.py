"""A coordinator's cold read of a fragment rotten in its only store, whose range a peer
still holds in its spool: the read returns the right bytes from that peer, and the
rotten object is quarantined and persisted again from the peer's copy (codecs none,
gzip and zstd: three fragments).

Set-up: two members; `a` is killed (its open spool gone) and rolled forward past
everything written, so it holds none of it; `b` still holds it all in its spool. A
prefix of it is then persisted (by the test) and published in the index: `a` now reads
that prefix from the store (a cold read), `b` keeps serving it from its spool (the
persisted fragment does not cover b's spool fragment, so b keeps its copy)."""

from __future__ import annotations

import hashlib
import signal
from pathlib import Path

import msgspec
import pytest
import redis

from fragment_store import FileStore, fragment_key, persist_fragment, verify_stored
from fragment_store.verified import quarantine_key
from protocol import FragmentSpec, JournalSpec, Status
from protocol.fragment import Codec, Fragment
from tests.coordinator.cluster import Cluster, Conn, make_workdir, until, wait_appendable
from tests.fragment_store.rot import ROT_CODECS, flip_byte
from tools.services import RedisService

pytestmark = pytest.mark.timeout(180)

J = "integrity/spool-fallback"


async def test_cold_read_of_a_rotten_only_copy_is_served_from_a_peers_spool(
        etcd, etcd_root, tmp_path: Path) -> None:  # noqa: ANN001
    store = FileStore((tmp_path / "store").as_uri() + "/")
    with RedisService("redis-spool-fallback") as rds:
        r = redis.Redis.from_url(rds.url)
        c = Cluster(etcd.url, etcd_root, make_workdir(), extra=["--redis", rds.url])
        a, b = c.add("zone-a", "node-a"), c.add("zone-b", "node-b")
        try:
            c.start(a)
            c.start(b)
            await c.wait_listening(a)
            await c.wait_listening(b)
            admin = await Conn.open(a.endpoint)
            try:
                spec = JournalSpec(name=J, replication=2, fragment=FragmentSpec(
                    length=1 << 24, compression_codec=Codec.GZIP, stores=(store.url,)))
                assert (await admin.apply(spec)).status == Status.OK
            finally:
                await admin.close()
            assert (await wait_appendable(a.endpoint, J, timeout=60)).status == Status.OK
            lines = [b"line %04d of the journal, held in spools\n" % i for i in range(400)]
            conn = await Conn.open(a.endpoint)
            try:
                for i in range(0, len(lines), 20):
                    assert (await conn.append(J, lines[i:i + 20])).status == Status.OK
            finally:
                await conn.close()
            written = b"".join(lines)

            c.kill(a, signal.SIGKILL)  # a's open spool (every byte so far) is gone
            a.proc.wait(10)
            c.start(a)
            await c.wait_listening(a)
            # Appendable again once `a` is back: the sync rolls it forward past `written`.
            assert (await wait_appendable(b.endpoint, J, timeout=60)).status == Status.OK

            # A prefix of it persisted as three fragments, one per codec (only store:
            # `store`), in the index; one byte of each stored object flipped.
            cuts = [0, *(len(b"".join(lines[:k])) for k in (90, 170, 250))]
            frags, rotten = [], {}
            for (begin, end), codec in zip(zip(cuts, cuts[1:]), ROT_CODECS):
                content = written[begin:end]
                f = persist_fragment(store, Fragment(
                    journal=J, begin=begin, end=end, codec=Codec(codec),
                    sum=hashlib.sha1(content).hexdigest()), content)
                frags.append(f)
                rotten[fragment_key(f)] = flip_byte(store, fragment_key(f))
            r.set("quire:index:" + J, msgspec.json.encode(tuple(frags)))
            r.publish("quire:index-updates", J)

            async def read_at_a() -> bytes:
                conn = await Conn.open(a.endpoint)
                try:
                    data, metas = await conn.read(J, 0, end_offset=len(written))
                finally:
                    await conn.close()
                assert all(m.status == Status.OK for m in metas), metas
                # Every read, before and after `a` loads the index, is right: from b by
                # a gap fill until then, from the store (rotten: from b's spool) after.
                assert data == written
                return data

            # Once `a` has the index its read of [0, cuts[-1]) is a cold read: every
            # store copy fails its proof, b's spool serves, the objects are quarantined.
            await until(lambda: _cold_read_done(read_at_a, store, list(rotten)), 60,
                        "a's cold reads falling back to b's spool")
            for f in frags:
                key = fragment_key(f)
                assert store.read_all(quarantine_key(key)) == rotten[key], f.codec
                assert verify_stored(store, f) == "", f"the rotten {f.codec} object was mended"
            assert await read_at_a() == written  # now from the mended store
            assert "persisted fragment read from a member's spool" in c.tail(a, 400)
        finally:
            c.stop_all()


async def _cold_read_done(read_at_a, store: FileStore, keys: list[str]) -> bool:  # noqa: ANN001
    await read_at_a()
    return all(store.exists(quarantine_key(key)) for key in keys)
