"""What the persistence-fault tests share: coordinators that persist (`--redis`, a real
Celery persist/index worker, a real S3 server — reached through a loopback proxy the
test can cut), a journal spec with that store, and readers of the store itself (never
through a coordinator): which records it holds and whether every object is whole."""

from __future__ import annotations

import contextlib
import hashlib
import uuid
from collections.abc import Iterator

from fragment_store import list_fragments, open_store, read_fragment
from fragment_store.keys import fragment_key
from protocol import Codec, FragmentSpec, JournalSpec, Status
from tests.coordinator.cluster import Conn, wait_appendable
from tests.workers.workers_support import worker_env
from tools.services import CeleryWorkerService, EtcdService, S3Service

from .harness import J


def store_spec(store_url: str, length: int, replication: int = 3,
               codec: Codec = Codec.NONE) -> JournalSpec:
    return JournalSpec(name=J, replication=replication, fragment=FragmentSpec(
        length=length, compression_codec=codec, stores=(store_url,), refresh_interval=1.0))


async def serve_spec(c, spec: JournalSpec) -> None:  # noqa: ANN001
    for n in c.nodes:
        await c.wait_listening(n)
    conn = await Conn.open(c.nodes[0].endpoint)
    try:
        assert (await conn.apply(spec)).status == Status.OK
    finally:
        await conn.close()
    assert (await wait_appendable(c.nodes[0].endpoint, J, timeout=60.0)).status == Status.OK


@contextlib.contextmanager
def persist_worker(redis_url: str, etcd: EtcdService, etcd_root: str, s3: S3Service,
                   s3_endpoint: str | None = None) -> Iterator[CeleryWorkerService]:
    """A real `celery -A workers.app worker -Q persist,index` on this test's Redis
    database; `s3_endpoint` (http://host:port) replaces the S3 server's own address."""
    env = worker_env(redis_url, etcd, etcd_root, s3)
    if s3_endpoint:
        env["QUIRE_S3_ENDPOINT"] = s3_endpoint
    svc = CeleryWorkerService(f"wp{uuid.uuid4().hex[:6]}", redis_url=redis_url,
                              queues=("persist", "index"), pool="threads", concurrency=2, env=env)
    svc.start()
    try:
        yield svc
    finally:
        svc.close()


def direct_store(s3: S3Service, store_url: str):  # noqa: ANN201
    """The store as the S3 server itself serves it (not through any proxy)."""
    return open_store(store_url, endpoint=s3.url, access_key=s3.access_key,
                      secret_key=s3.secret_key)


def stored_ids(store) -> set[int]:  # noqa: ANN001
    """Ids of the records in every fragment the store holds (each read whole and its
    length and SHA-1 verified by read_fragment: a torn object raises)."""
    ids: set[int] = set()
    for f in list_fragments(store, J):
        data = b"".join(read_fragment(store, f))
        ids.update(int(line.split(b"|", 1)[0]) for line in data.split(b"\n") if line)
    return ids


def check_whole(store) -> int:  # noqa: ANN001
    """Every object of J in the store is a whole fragment: its content (decompressed)
    has the length and SHA-1 its name says. Returns how many there are."""
    frags = list_fragments(store, J)
    for f in frags:
        data = b"".join(read_fragment(store, f, verify=False))
        assert len(data) == f.end - f.begin, (fragment_key(f), len(data))
        assert hashlib.sha1(data).hexdigest() == f.sum, fragment_key(f)
    return len(frags)
