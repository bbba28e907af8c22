"""Jobs' store-reading targets read with the journal's whole `stores` list: the run
context carries the first store (`stores`) and the others (`fallback_stores`), and the
Dask target passes them to the reader, so a fragment rotten in the first store is read
from another (and the rotten object quarantined and mended) instead of failing the run."""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest

from fragment_store import FileStore, FragmentCorrupt, fragment_key, fragment_name, verify_stored
from fragment_store.verified import quarantine_key
from protocol import FragmentSpec, JournalSpec
from spark.jobs.dask_targets import counts
from tests.fragment_store.rot import flip_byte
from tests.spark.batch_corpus import json_lines, persist_journal
from workers.jobs_targets import journal_stores
from workers.topology import read_topology_sync

J = "jobs-rot/events"


def test_run_context_stores_name_every_store_of_the_journal(etcd: Any, etcd_root: str) -> None:
    import aetcd

    specs = {"jobs-rot/two": ("file:///tmp/a/", "file:///tmp/b/", "file:///tmp/c/"),
             "jobs-rot/one": ("file:///tmp/a/",), "jobs-rot/none": ()}

    async def put_specs() -> None:
        async with aetcd.Client(host=etcd.host, port=etcd.port) as client:
            for name, stores in specs.items():
                spec = JournalSpec(name=name, fragment=FragmentSpec(stores=stores))
                await client.put(f"{etcd_root}/journals/{name}".encode(), msgspec.json.encode(spec))

    asyncio.run(put_specs())
    topo = read_topology_sync(etcd.url, etcd_root)
    stores, fallbacks = journal_stores(topo, [*specs, "jobs-rot/unknown"])
    assert stores == {"jobs-rot/two": "file:///tmp/a/", "jobs-rot/one": "file:///tmp/a/"}
    assert fallbacks == {"jobs-rot/two": ["file:///tmp/b/", "file:///tmp/c/"], "jobs-rot/one": []}


@pytest.mark.parametrize("codec", ["none", "gzip", "zstd"])
def test_dask_target_reads_a_good_copy_from_the_fallback_stores(tmp_path: Path, codec: str,
                                                                monkeypatch: Any) -> None:
    from fragment_store import verified
    from fragment_store.proof import _Cache

    # No proven content kept between the two reads below (the second must read the store).
    monkeypatch.setattr(verified, "_CACHE", _Cache(0))
    primary = FileStore((tmp_path / "primary").as_uri() + "/")
    backup = FileStore((tmp_path / "backup").as_uri() + "/")
    content = json_lines(random.Random(5), 240)
    cuts = [content.index(b"\n", len(content) * k // 3) + 1 for k in (1, 2)]
    frags = persist_journal(primary, J, content, cuts, (codec,))
    persist_journal(backup, J, content, cuts, (codec,))
    rotten = {fragment_key(f): flip_byte(primary, fragment_key(f)) for f in frags}
    want = Counter(json.loads(line)["key"] for line in content.splitlines() if line)
    ctx = {"job": "rot", "window_start": 0, "window_end": 60, "rerun": 0, "attempt": 1,
           "ranges": {J: [0, len(content)]}, "args": {"field": "key"},
           "stores": {J: primary.url}, "fallback_stores": {J: [backup.url]}}

    out = counts(ctx)
    assert dict(zip(out["key"], out["messages"])) == dict(want)
    for f in frags:
        key = fragment_key(f)
        assert primary.read_all(quarantine_key(key)) == rotten[key]
        assert verify_stored(primary, f) == "", "the rotten object was mended"

    # Without the other stores (what the target was given before): the run fails,
    # naming the fragment, and counts nothing from the rotten bytes.
    flip_byte(primary, fragment_key(frags[0]))
    with pytest.raises(FragmentCorrupt) as err:
        counts({**ctx, "fallback_stores": {}})
    assert fragment_name(frags[0]) in str(err.value)
