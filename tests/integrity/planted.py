"""Journals planted in stores — fragments persisted before any coordinator saw them,
each journal's index set in Redis — and one real coordinator serving them: what the
integrity tests rot and then read through the coordinator."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import msgspec
import redis

from fragment_store import FileStore, persist_fragment
from protocol import FragmentSpec, JournalSpec, Status
from protocol.fragment import Codec, Fragment
from tests.coordinator.cluster import Conn, Node, running


@dataclass(frozen=True)
class Planted:
    journal: str
    fragments: list[Fragment]
    """As persisted in the primary store."""
    content: bytes
    good_copy: bool
    """Whether the backup store holds every fragment too."""

    @property
    def end(self) -> int:
        return self.fragments[-1].end


def plant(primary: FileStore, backup: FileStore, r: redis.Redis, journal: str, codec: str,
          content: bytes, fragments: list[Fragment], good_copy: bool) -> tuple[Planted, JournalSpec]:
    """Persist `fragments` of `content` in `primary` (and `backup` with `good_copy`), set the
    journal's index, and return it with the spec that names both stores."""
    frags = [persist_fragment(primary, f, content[f.begin:f.end]) for f in fragments]
    if good_copy:
        for f in frags:
            persist_fragment(backup, f, content[f.begin:f.end])
    r.set("quire:index:" + journal, msgspec.json.encode(tuple(frags)))
    spec = JournalSpec(name=journal, replication=1, fragment=FragmentSpec(
        length=1 << 20, compression_codec=Codec(codec), stores=(primary.url, backup.url)))
    return Planted(journal, frags, content, good_copy), spec


@asynccontextmanager
async def serving(etcd_url: str, root: str, redis_url: str, specs: list[JournalSpec]) -> AsyncIterator[Node]:
    """One coordinator with the journals of `specs` applied, reading indexes from Redis."""
    with running(etcd_url, root, n=1, extra=["--redis", redis_url]) as c:
        node = c.nodes[0]
        await c.wait_listening(node)
        admin = await Conn.open(node.endpoint)
        assert (await admin.apply(*specs)).status == Status.OK
        await admin.close()
        yield node


async def cold_read(endpoint: str, journal: str, end: int) -> tuple[bytes, list]:
    """A read of [0, end) on a connection of its own: the content and the metadata frames."""
    conn = await Conn.open(endpoint)
    try:
        return await conn.read(journal, 0, end_offset=end)
    finally:
        await conn.close()


async def served(endpoint: str, journal: str, end: int) -> bool:
    """The coordinator answers reads of `journal` from its index: content, or its refusal."""
    data, metas = await cold_read(endpoint, journal, end)
    return bool(data) or any(m.status == Status.FRAGMENT_CORRUPT for m in metas)
