"""A recovery log that lost committed batches (its head is below the offset the local
store was built through) is refused, not silently served.

Found by `quire chaos` (issue 16's chaos bullet): after a pause-etcd fault a broker
restarted a recovery log at offset 0 although content up to 2189 was acknowledged and
persisted. The new primary fenced (head 28), restored a snapshot taken at log offset
1906, "replayed" nothing (end < begin) and went on counting from the snapshot's state,
appending new batches over offsets the snapshot already reflected; later restores then
failed mid-record and the final counts, rebuilt from the log, were short. The shard must
fail instead, naming the log and both offsets."""

from __future__ import annotations

import asyncio
import os

import pytest

from consumers.app import load_app
from consumers.recoverylog import RecoveryLogRegressed
from consumers.runner import ShardRunner
from consumers.store import OFFSET_PREFIX, Store
from protocol import ProcessId
from protocol.shard import ShardSource, ShardSpec, ShardState
from quire.client import Client

from .conftest import create_journals, journal

pytestmark = pytest.mark.timeout(90)


async def test_a_log_below_the_store_fails_the_shard(coordinators, etcd_client, etcd_root) -> None:
    env = coordinators
    spec = ShardSpec(id="c-regressed", sources=(ShardSource(journal="src/regressed"),),
                     recovery_log_prefix="recovery")
    await create_journals(env, [journal("src/regressed", env.store_url),
                                journal(spec.recovery_log, env.store_url)])
    data_dir = os.path.join(env.workdir, "member")
    async with Client(env.endpoints) as client:
        runner = ShardRunner(client=client, etcd=etcd_client, root=etcd_root,
                             me=ProcessId("zone-a", "m1"), spec=spec,
                             app=load_app("consumers.examples.counts:Counts"),
                             data_dir=data_dir)
        # The local store was built through log offset 1906 (k counted 7 times) ...
        store = Store(runner.db_path)
        store.apply([(b"c/k", b"7"), (OFFSET_PREFIX + b"src/regressed", b"700")], 1906)
        store.close()
        # ... but the log holds nothing: the fence record will end near offset 28.
        with pytest.raises(RecoveryLogRegressed) as err:
            await asyncio.wait_for(runner.run_primary("zone-a.m1.1", asyncio.Event()), 30)
        assert err.value.journal == spec.recovery_log
        assert err.value.begin == 1906 and 0 < err.value.end < 1906
        assert "below offset 1906" in str(err.value)
        assert runner.lifecycle.state is not ShardState.PRIMARY  # it never served
        assert await client.write_head("src/regressed") == 0
