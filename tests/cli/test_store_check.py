"""`quire journals apply` and the stores live workers accept (issue 51, case 2).

A worker announces its stores in etcd (topology/worker_stores.py); apply refuses a spec
whose store no live worker writes to when the workers run with auth on, and warns with
auth off — naming the stores they do accept (tools/cli/store_check.py)."""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import aetcd
import pytest

from protocol import ApplyChange, FragmentSpec, JournalSpec
from tools.cli.common import EXIT_INVALID
from tools.cli.store_check import StoreProblem, check_spec_stores, find_problems
from tools.services import CeleryWorkerService
from topology.worker_stores import WorkerStores, list_worker_stores, stores_accepted_by_none

from tests.workers.workers_support import worker_env

REPO = Path(__file__).resolve().parents[2]


def upsert(name: str, store: str) -> ApplyChange:
    return ApplyChange(upsert=JournalSpec(name=name, replication=1,
                                          fragment=FragmentSpec(stores=(store,))))


def test_accepts_follows_the_worker_rule() -> None:
    open_ = WorkerStores(worker="w1", stores=("file:///a/",), restricted=False)
    closed = WorkerStores(worker="w2", stores=("file:///a/", "s3://b/"), restricted=True, auth=True)
    assert open_.accepts("file:///elsewhere/") and closed.accepts("s3://b/")
    assert not closed.accepts("file:///elsewhere/")
    assert stores_accepted_by_none(["file:///x/", "s3://b/"], [closed]) == ["file:///x/"]
    assert stores_accepted_by_none(["file:///x/"], []) == ["file:///x/"]
    assert find_problems({"j": "file:///x/"}, [closed, open_]) == {}


def test_refused_with_auth_on_naming_the_accepted_stores() -> None:
    workers = [WorkerStores(worker="w", stores=("file:///cluster/",), restricted=True, auth=True)]
    with pytest.raises(StoreProblem) as err:
        check_spec_stores([upsert("a/b", "file:///some/dir/"), upsert("a/c", "file:///cluster/")],
                          workers=workers)
    assert err.value.code == EXIT_INVALID
    text = str(err.value)
    assert "refused" in text and "file:///some/dir/ (journal a/b)" in text
    assert "accept: file:///cluster/" in text and "a/c" not in text
    check_spec_stores([upsert("a/c", "file:///cluster/")], workers=workers)  # fine: no error


def test_warned_with_auth_off(capsys: pytest.CaptureFixture[str]) -> None:
    workers = [WorkerStores(worker="w", stores=("file:///cluster/", "s3://extra/"), restricted=True)]
    check_spec_stores([upsert("a/b", "file:///some/dir/")], workers=workers)
    err = capsys.readouterr().err
    assert "warning: no live worker persists to file:///some/dir/" in " ".join(err.split())
    assert "file:///cluster/, s3://extra/" in " ".join(err.split())


def _apply(spec: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tools.cli.main", "journals", "apply", "-f",
                           str(spec)], capture_output=True, text=True, timeout=60, env=env,
                          cwd=REPO)


def _announced(etcd, root: str) -> list[WorkerStores]:  # noqa: ANN001
    async def read() -> list[WorkerStores]:
        c = aetcd.Client(host="127.0.0.1", port=etcd.port)
        try:
            return await list_worker_stores(c, root)
        finally:
            await c.close()
    return asyncio.run(read())


def test_apply_refuses_a_store_no_auth_worker_writes_to(redis_db, etcd, etcd_root, tmp_path) -> None:
    """Case 2: with auth on, a spec naming file:///some/dir/ (not the cluster's
    QUIRE_STORE_URL) is refused before anything is applied, naming the accepted store."""
    store = (tmp_path / "store").as_uri() + "/"
    env = worker_env(redis_db.url, etcd, etcd_root, None, QUIRE_STORE_URL=store,
                     QUIRE_AUTH_KEYS=base64.b64encode(os.urandom(32)).decode())
    spec = tmp_path / "specs.yaml"
    spec.write_text(textwrap.dedent("""\
        name: acme/elsewhere
        replication: 1
        fragment: {stores: ["file:///some/dir/"]}
        """))
    with CeleryWorkerService("w-auth", redis_url=redis_db.url, queues=("persist",),
                             pool="threads", concurrency=1, env=env).start():
        deadline = time.monotonic() + 30
        while not _announced(etcd, etcd_root):
            assert time.monotonic() < deadline, "the worker never announced its stores in etcd"
            time.sleep(0.2)
        [w] = _announced(etcd, etcd_root)
        assert w.auth and w.restricted and w.stores == (store,)
        cli_env = {**os.environ, "PYTHONPATH": str(REPO), "QUIRE_ETCD_URL": etcd.url,
                   "QUIRE_ETCD_ROOT": etcd_root, "QUIRE_BROKER": "127.0.0.1:1"}
        out = _apply(spec, cli_env)
        assert out.returncode == EXIT_INVALID, out.stdout + out.stderr
        said = " ".join(out.stderr.split())
        assert "no live worker persists to file:///some/dir/ (journal acme/elsewhere)" in said
        assert f"accept: {store}" in said
    # The worker stopped: its announcement went with its lease.
    deadline = time.monotonic() + 30
    while _announced(etcd, etcd_root):
        assert time.monotonic() < deadline, "the announcement outlived its worker"
        time.sleep(0.2)
