"""`quire journals prune` through a real coordinator, etcd, Redis and a prune worker."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec
import pytest

from fragment_store import fragment_key, open_store, persist_fragment
from protocol import Fragment, FragmentSpec, JournalSpec
from tools.local_cluster import hello_probe
from tools.services import CeleryWorkerService, Service, free_port

from tests.workers.workers_support import put_keys, worker_env

pytestmark = pytest.mark.timeout(180)


@contextmanager
def _prune_cluster(name: str, etcd, etcd_root: str, redis_db,  # noqa: ANN001
                   tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A coordinator and a worker on the prune and index queues; yields the coordinator's
    endpoint and the worker's environment (for the CLI), and stops both afterwards."""
    endpoint = f"127.0.0.1:{free_port()}"
    coord = Service(f"{name}-coord-{uuid.uuid4().hex[:6]}", [
        sys.executable, "-m", "coordinator.main", "--zone", "local", "--id", f"{name}-coord",
        "--listen", endpoint, "--etcd", etcd.url, "--root", etcd_root,
        "--spool-dir", str(tmp_path / "spool"), "--lease-ttl", "5"],
        workdir=tmp_path / "c", probe=lambda: hello_probe(endpoint), ready_timeout=60)
    env = worker_env(redis_db.url, etcd, etcd_root, None)
    worker = CeleryWorkerService(f"w{uuid.uuid4().hex[:6]}", redis_url=redis_db.url,
                                 queues=("prune", "index"), pool="threads", concurrency=2, env=env)
    try:
        coord.start()
        worker.start()
        yield endpoint, env
    finally:
        worker.close()
        coord.close()


def test_prune_dry_run_lists_what_the_real_run_removes(etcd, etcd_root, redis_db, tmp_path) -> None:  # type: ignore[no-untyped-def]
    store_url = (tmp_path / "store").as_uri() + "/"
    store = open_store(store_url)
    j = "cli/pruned"
    frags = []
    for b in (0, 10, 20):
        data = bytes([97 + b // 10]) * 10
        frags.append(persist_fragment(store, Fragment(journal=j, begin=b, end=b + 10,
                                                      sum=hashlib.sha1(data).hexdigest(),
                                                      codec="none"), data))
    old = time.time() - 3600
    for f in frags:
        os.utime(store.root / fragment_key(f), (old, old))  # an hour old, no waiting
    spec = JournalSpec(name=j, replication=1, fragment=FragmentSpec(
        length=1 << 20, compression_codec="none", stores=(store_url,), retention=60.0))
    put_keys(etcd, {f"{etcd_root}/journals/{j}": msgspec.json.encode(spec)})

    with _prune_cluster("prune", etcd, etcd_root, redis_db, tmp_path) as (endpoint, env):
        def quire(*args: str) -> str:
            proc = subprocess.run([sys.executable, "-m", "tools.cli.main", "journals", "prune",
                                   *args], capture_output=True, timeout=90,
                                  env={**os.environ, **env, "QUIRE_BROKER": endpoint})
            assert proc.returncode == 0, proc.stderr.decode()
            return proc.stdout.decode()

        dry = [json.loads(ln) for ln in quire("--dry-run", "-o", "json").splitlines()]
        assert [r["key"] for r in dry] == [fragment_key(f) for f in frags[:2]]
        assert all(r["dry_run"] for r in dry)
        assert len(list(store.list(j + "/"))) == 3  # nothing removed
        real = [json.loads(ln) for ln in quire("-o", "json").splitlines()]
        assert [r["key"] for r in real] == [r["key"] for r in dry]
        assert [i.key for i in store.list(j + "/")] == [fragment_key(frags[2])]  # the head stays
        assert "removed 0 fragments" in quire()

        def stats(*args: str) -> str:
            proc = subprocess.run([sys.executable, "-m", "tools.cli.main", "journals", "list",
                                   "--stats", *args], capture_output=True, timeout=60,
                                  env={**os.environ, **env, "QUIRE_BROKER": endpoint})
            assert proc.returncode == 0, proc.stderr.decode()
            return proc.stdout.decode()

        row = json.loads(stats("-o", "json"))
        assert isinstance(row.pop("watermark"), float)  # the persisted watermark (jobs, #34)
        # Nothing acknowledged waits for the store and no persist failed (#51).
        assert (row.pop("backlog_bytes"), row.pop("backlog_age"), row.pop("persist_error")) \
            == (0, 0.0, "")
        last = store.stat(fragment_key(frags[2]))
        assert row == {"journal": j, "fragments": 1, "stored_bytes": 10, "oldest": last.mod_time,
                       "newest": last.mod_time, "begin": 20, "end": 30}
        assert "20..30" in stats()


def test_delete_purge_removes_only_that_journals_objects(etcd, etcd_root, redis_db, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from fragment_store import manifest_key, write_manifest
    from fragment_store.index import CoverSet

    store_url = (tmp_path / "store").as_uri() + "/"
    store = open_store(store_url)
    gone, prefixed, nested = "cli/n", "cli/nn", "cli/n/sub"  # "cli/n" prefixes both names
    keys: dict[str, list[str]] = {}
    for j in (gone, prefixed, nested):
        spec = JournalSpec(name=j, replication=1, fragment=FragmentSpec(
            length=1 << 20, compression_codec="none", stores=(store_url,)))
        put_keys(etcd, {f"{etcd_root}/journals/{j}": msgspec.json.encode(spec)})
        fs = []
        for b in (0, 10):
            data = b"p" * 10
            fs.append(persist_fragment(store, Fragment(journal=j, begin=b, end=b + 10,
                                                       sum=hashlib.sha1(data).hexdigest(),
                                                       codec="none"), data))
        write_manifest(store, j, CoverSet(fs))
        keys[j] = [fragment_key(f) for f in fs] + [manifest_key(j)]

    with _prune_cluster("purge", etcd, etcd_root, redis_db, tmp_path) as (endpoint, env):
        proc = subprocess.run([sys.executable, "-m", "tools.cli.main", "journals", "delete", gone,
                               "--purge", "--grace", "0", "-o", "json"], capture_output=True,
                              timeout=90, env={**os.environ, **env, "QUIRE_BROKER": endpoint})
        assert proc.returncode == 0, proc.stderr.decode()
        assert json.loads(proc.stdout)["purge_after"] == 0
        from tools.services import wait_for

        wait_for(lambda: not any(store.exists(k) for k in keys[gone]), timeout=30,
                 what="the deleted journal's objects to be purged")
        assert all(store.exists(k) for k in keys[prefixed] + keys[nested])
