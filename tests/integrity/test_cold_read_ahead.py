"""A coordinator's cold read proves the next persisted fragment while it streams this one
(`ColdReadAhead`): still no byte of a fragment before its proof. In process: what was
read ahead is handed on only through `take`, after its proof; a rotten one raises there.
Through a real coordinator: a journal of three persisted fragments with the middle one
rotten — all of the first arrives, not a byte of the second, FRAGMENT_CORRUPT names it;
with a good copy in the journal's other store the whole journal reads back right."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import redis

from coordinator.read_relay import ColdReadAhead
from fragment_store import FileStore, FragmentCorrupt, fragment_key, fragment_name, persist_fragment
from fragment_store.verified import quarantine_key
from protocol import Status
from protocol.fragment import Codec, Fragment
from tests.coordinator.cluster import until
from tests.fragment_store.rot import flip_byte
from tests.integrity.planted import Planted, cold_read, plant, serving
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
    cases: list[Planted] = []
    with RedisService("redis-cold-ahead") as rds:
        r = redis.Redis.from_url(rds.url)
        specs = []
        for codec in ("none", "gzip", "zstd"):
            for good_copy in (True, False):
                j = f"ahead/{codec}-{'copy' if good_copy else 'alone'}"
                content, frags = fragments(j, codec)
                case, spec = plant(primary, backup, r, j, codec, content, frags, good_copy)
                cases.append(case)
                specs.append(spec)
        async with serving(etcd.url, etcd_root, rds.url, specs) as node:
            async def whole(case: Planted) -> bool:
                return (await cold_read(node.endpoint, case.journal, case.end))[0] == case.content

            for case in cases:  # every replica has loaded its index
                await until(lambda case=case: whole(case), 60, f"{case.journal} served")
            for case in cases:
                second = case.fragments[1]
                key = fragment_key(second)
                rotten = flip_byte(primary, key)
                data, metas = await cold_read(node.endpoint, case.journal, case.end)
                if case.good_copy:
                    assert data == case.content, case.journal
                    assert primary.read_all(quarantine_key(key)) == rotten
                else:
                    assert data == case.content[:second.begin], case.journal  # all of the first, none of it
                    assert metas[-1].status == Status.FRAGMENT_CORRUPT
                    assert fragment_name(second) in metas[-1].message
