"""The persister's read-back, on a real cluster (3 coordinators with `--redis`, R=3, their
spools on errfs, a real Celery persist/index worker and the S3 server): three closed
fragments of the primary are damaged before any worker runs — one truncated, one with a
flipped byte, one whose reads fail with EIO — and a fourth left whole. Then the worker
persists: nothing damaged is ever uploaded (every object in the store is a whole
fragment whose SHA-1 is its name's), each damaged copy is counted by its reason and
logged naming its fragment, and dropped as lost by the primary; the fragments are
persisted from the replicas' good copies, and the journal reads whole through every
member. No coordinator crashed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from pathlib import Path

import pytest

from fragment_store import list_fragments
from fragment_store.keys import fragment_key
from protocol import Status
from tests.coordinator.cluster import scrape_metric
from tools.services.disk_faults import errfs

from .harness import J, Model, alive, append, check, cluster_on, read_ids, route
from .persisting import check_whole, direct_store, persist_worker, serve_spec, store_spec, stored_ids

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts need root")

RECORD = 8 << 10
LENGTH = 32 << 10
FRAGMENTS = 4  # closed fragments before the damage: truncated, flipped, unreadable, whole


def damaged(log_path: str) -> dict[str, str]:
    """fragment key -> reason, from the coordinator's read-back errors (JSON log)."""
    out = {}
    with open(log_path, "rb") as f:
        for line in f:
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                if "cannot be read back" in rec.get("event", ""):
                    out[rec["fragment"]] = rec["reason"]
    return out


async def test_a_fragment_that_cannot_be_read_back_is_never_uploaded(
        etcd, etcd_root, redis_db, s3, s3_bucket) -> None:  # noqa: ANN001
    store_url = f"s3://{s3_bucket.name}/"
    store = direct_store(s3, store_url)
    with contextlib.ExitStack() as stack:
        fss = [stack.enter_context(errfs(32 << 20, f"rb{i}", direct_io=True)) for i in range(3)]
        with cluster_on(etcd.url, etcd_root, [str(f.path) for f in fss],
                        envs=[s3.client_env()] * 3, extra=["--redis", redis_db.url]) as c:
            await serve_spec(c, store_spec(store_url, LENGTH))
            model = Model()
            primary, _ = await route(c)
            p = [n.suffix for n in c.nodes].index(primary)
            backing = fss[p].backing / J
            raws: list[Path] = []
            while len(raws) < FRAGMENTS:  # no worker yet: closed fragments stay on disk
                assert await append(c, model, RECORD, via=primary) == Status.OK, model.errors
                raws = sorted(backing.glob("*.raw"))
            raws = raws[:FRAGMENTS]
            short, flipped, unreadable, whole = raws
            os.truncate(short, short.stat().st_size - 100)
            with open(flipped, "r+b") as f:
                f.seek(RECORD + 17)
                b = f.read(1)
                f.seek(RECORD + 17)
                f.write(bytes([b[0] ^ 0x01]))
            fss[p].fail_reads(unreadable.name[:33])  # "<begin>-<end>": that file alone
            closed_end = int(whole.name[17:33], 16)  # records are RECORD bytes each, in order
            checked = [i for k, i in enumerate(model.acked) if (k + 1) * RECORD <= closed_end]
            names = {r.name.rsplit(".", 1)[0]: why for r, why in
                     ((short, "length"), (flipped, "checksum"), (unreadable, "eio"))}

            with persist_worker(redis_db.url, etcd, etcd_root, s3) as worker:
                deadline = time.monotonic() + 120
                while not set(checked) <= stored_ids(store):
                    assert time.monotonic() < deadline, "the closed fragments were not persisted"
                    await asyncio.sleep(0.5)  # polling the store's listing, bounded above
                assert check_whole(store) >= FRAGMENTS
                keys = {fragment_key(f).rsplit("/", 1)[1].rsplit(".", 1)[0]
                        for f in list_fragments(store, J)}
                assert set(names) <= keys  # persisted, from the replicas' good copies
                # Counted by reason and logged naming the fragment, on the primary only.
                port = c.nodes[p].metrics_port
                for reason in ("length", "checksum", "eio"):
                    assert scrape_metric(port, "quire_fragment_readback_failures_total",
                                         f'{{reason="{reason}"}}') == 1, reason
                logged = {k.rsplit("/", 1)[1].rsplit(".", 1)[0]: why
                          for k, why in damaged(c.nodes[p].log_path).items()}
                assert logged == names, (logged, names)
                for i, n in enumerate(c.nodes):
                    if i != p:
                        assert not damaged(n.log_path), n.suffix
                fss[p].heal()
                # More appends, then the journal reads whole through every member.
                for _ in range(4):
                    assert await append(c, model, RECORD, via=primary) == Status.OK, model.errors
                for n in c.nodes:
                    check(model, await read_ids(c, via=n.suffix))
                alive(c)
                assert worker.running, worker.returncode
                # Checked; now stopped hard: the worker would stop first, and a graceful
                # drain would wait (15 s) for the persistence of its exit roll.
                for n in c.nodes:
                    c.kill(n)
                worker.stop(timeout=5.0)
