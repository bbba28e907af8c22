"""A coordinator's cold read proves the next persisted fragment while it streams this one
(`ColdReadAhead`): still no byte of a fragment before its proof. In process: what was
read ahead is handed on only through `take`, after its proof; a rotten one raises there.
Through a real coordinator: a journal of three persisted fragments with the middle one
rotten — all of the first arrives, not a byte of the second, FRAGMENT_CORRUPT names it;
with a good copy in the journal's other store the whole journal reads back right."""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec
import pytest
import redis

from coordinator.read_relay import ColdReadAhead
from fragment_store import FileStore, FragmentCorrupt, fragment_key, fragment_name, persist_fragment
from fragment_store.verified import quarantine_key
from protocol import FragmentSpec, JournalSpec, Status
from protocol.fragment import Codec, Fragment
from tests.coordinator.cluster import Conn, running, until
from tests.fragment_store.rot import flip_byte
from tools.services import RedisService

pytestmark = pytest.mark.timeout(180)


def fragments(journal: str, codec: str, sizes: tuple[int, ...] = (3000, 2000, 2500)
              ) -> tuple[bytes, list[Fragment]]:
    content, frags = b"", []
    for n in sizes:
        part = b"".join(b"%s %d %d\n" % (journal.encode(), len(content), i) for i in range(n))
        frags.append(Fragment(journal=journal, begin=len(content), end=len(content) + len(part),
                              sum=hashlib.sha1(part).hexdigest(), codec=Codec(codec)))
        content += part
    return content, frags


async def test_read_ahead_hands_on_only_proven_content(tmp_path: Path) -> None:
    store = FileStore((tmp_path / "store").as_uri() + "/")
    content, frags = fragments("ahead/unit", "gzip")
    frags = [persist_fragment(store, f, content[f.begin:f.end]) for f in frags]
    ahead = ColdReadAhead()
    ahead.start(frags[1], (store.url,), [])
    chunks = await ahead.take(frags[1], frags[1].begin)
    assert b"".join(chunks) == content[frags[1].begin:frags[1].end]
    assert await ahead.take(frags[1], frags[1].begin) is None  # taken once
    # Not what the read reached (another fragment, or an offset inside): dropped, None.
    ahead.start(frags[2], (store.url,), [])
    assert await ahead.take(frags[0], frags[0].begin) is None
    ahead.start(frags[2], (store.url,), [])
    assert await ahead.take(frags[2], frags[2].begin + 1) is None
    # Rotten, no good copy: the error comes out of take, no chunk does.
    flip_byte(store, fragment_key(frags[2]))
    ahead.start(frags[2], (store.url,), [])
    with pytest.raises(FragmentCorrupt):
        await ahead.take(frags[2], frags[2].begin)
    ahead.drop()


async def test_cold_read_ahead_never_passes_rot(etcd, etcd_root, tmp_path: Path) -> None:  # noqa: ANN001
    primary = FileStore((tmp_path / "primary").as_uri() + "/")
    backup = FileStore((tmp_path / "backup").as_uri() + "/")
    cases = []
    with RedisService("redis-cold-ahead") as rds:
        r = redis.Redis.from_url(rds.url)
        specs = []
        for codec in ("none", "gzip", "zstd"):
            for good_copy in (True, False):
                j = f"ahead/{codec}-{'copy' if good_copy else 'alone'}"
                content, frags = fragments(j, codec)
                frags = [persist_fragment(primary, f, content[f.begin:f.end]) for f in frags]
                if good_copy:
                    for f in frags:
                        persist_fragment(backup, f, content[f.begin:f.end])
                r.set("quire:index:" + j, msgspec.json.encode(tuple(frags)))
                cases.append((j, frags, content, good_copy))
                specs.append(JournalSpec(name=j, replication=1, fragment=FragmentSpec(
                    length=1 << 20, compression_codec=Codec(codec),
                    stores=(primary.url, backup.url))))
        with running(etcd.url, etcd_root, n=1, extra=["--redis", rds.url]) as c:
            node = c.nodes[0]
            await c.wait_listening(node)
            admin = await Conn.open(node.endpoint)
            assert (await admin.apply(*specs)).status == Status.OK
            await admin.close()

            async def cold_read(j: str, end: int) -> tuple[bytes, list]:
                conn = await Conn.open(node.endpoint)
                try:
                    return await conn.read(j, 0, end_offset=end)
                finally:
                    await conn.close()

            async def whole(j: str, content: bytes) -> bool:
                return (await cold_read(j, len(content)))[0] == content

            for j, frags, content, _ in cases:  # every replica has loaded its index
                await until(lambda j=j, content=content: whole(j, content), 60, f"{j} served")
            for j, frags, content, good_copy in cases:
                key = fragment_key(frags[1])
                rotten = flip_byte(primary, key)
                data, metas = await cold_read(j, len(content))
                if good_copy:
                    assert data == content, j
                    assert primary.read_all(quarantine_key(key)) == rotten
                else:
                    assert data == content[:frags[1].begin], j  # all of the first, none of it
                    assert metas[-1].status == Status.FRAGMENT_CORRUPT
                    assert fragment_name(frags[1]) in metas[-1].message
