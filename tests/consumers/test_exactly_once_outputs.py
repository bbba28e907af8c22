"""End-to-end exactly-once shard outputs (issue 17; docs/exactly-once.md "Consumer shards").

The Counts example publishes totals to an output journal. Three members lead the shard
one after another; the first SIGKILLs itself right after its first store commit,
before any of that transaction's outputs is appended (`after-commit`), the second right
after its first transaction's outputs were acknowledged (`after-outputs`) — real kill
-9s at chosen moments (consumers/faults.py), nothing mocked. Each successor
re-sends the last committed transaction's outputs under the old generation: the first
re-send lands (it never had), the second is dropped by the broker (it had).

Checked: the output journal holds exactly the concatenation, in commit order, of every
committed transaction's outputs as recorded in the recovery log (none missing, none
twice); the final totals equal the model; each primary had its own generation, and the
first one's generation is retired (a zombie's late output is refused).
"""

from __future__ import annotations

import json
import signal

import pytest

from consumers.faults import FAULT_ENV
from consumers.outputs import ledger_of, producer_name
from consumers.recoverylog import RecordReader
from protocol.errors import ProducerGenerationRetired
from quire.client import Client, TxnId
from topology.shards import read_primaries

from .conftest import wait_for
from .test_failover import caught_up, model, replayed_counts, setup, write

pytestmark = pytest.mark.timeout(180)

OUT, SHARD = "out/counts", "count-0"


async def _killed_at(member, point: str) -> None:  # noqa: ANN001
    await wait_for(lambda: member.proc.poll() is not None, 60, f"{member.id} to die at {point}")
    assert member.proc.returncode == -signal.SIGKILL, member.log_text()[-3000:]
    assert f"fault point {point}@1: SIGKILL" in member.log_text()


async def test_kill9_around_output_appends_each_commit_lands_once(  # noqa: ANN001
        coordinators, member_factory, etcd_client, etcd_root, monkeypatch) -> None:
    env = coordinators
    await setup(env, etcd_client, etcd_root, 1)

    def member(suffix: str, zone: str, fault: str | None):  # noqa: ANN202
        if fault:
            monkeypatch.setenv(FAULT_ENV, f"{fault}@1")
        try:
            return member_factory(zone, suffix)  # the process inherits the environment now
        finally:
            monkeypatch.delenv(FAULT_ENV, raising=False)

    async with Client(env.endpoints) as client:
        await write(client, 0, 500, 1)
        first = member("first", "zone-0", "after-commit")
        await _killed_at(first, "after-commit")
        assert await client.write_head(OUT) == 0  # its committed outputs never went out

        await write(client, 500, 1000, 1)
        second = member("second", "zone-1", "after-outputs")
        await _killed_at(second, "after-outputs")
        assert "re-sent the last transaction's outputs" in second.log_text()

        await write(client, 1000, 1500, 1)
        third = member("third", "zone-0", None)
        await third.ready()
        await wait_for(lambda: caught_up(client, etcd_client, etcd_root, 1), 60, "the last part")
        assert "re-sent the last transaction's outputs" in third.log_text()
        assert third.terminate() == 0, third.log_text()[-3000:]
        assert not await read_primaries(etcd_client, etcd_root)

        expected = model(1500, 1)[SHARD]
        assert await replayed_counts(client, SHARD) == expected

        # Every committed transaction's outputs, in commit order, from the recovery log.
        head = await client.write_head(f"recovery/{SHARD}")
        reader, ledgers = RecordReader(0), []
        async for at, data in client.read(f"recovery/{SHARD}", 0, end_offset=head):
            for record, _ in reader.feed(at, data):
                ledger = None if record.fence else ledger_of(record.ops)
                if ledger is not None:
                    ledgers.append(ledger)
        committed = [i for led in ledgers for i in led.intents if i.journal == OUT]
        assert [i.txn for i in committed] == list(range(1, len(committed) + 1))
        assert sorted({led.generation for led in ledgers}) == [1, 2, 3]

        out_head = await client.write_head(OUT)
        published = b""
        async for _, data in client.read(OUT, 0, end_offset=out_head):
            published += data
        assert published == b"".join(i.data for i in committed), \
            "the output journal is not exactly the committed outputs, once each, in order"
        totals: dict[str, int] = {}
        for line in published.splitlines():
            row = json.loads(line)
            totals[row["key"]] = row["count"]
        assert totals == expected

        # The first primary's generation is retired: its late output would be refused.
        last = committed[-1]
        with pytest.raises(ProducerGenerationRetired):
            await client.append(OUT, b'{"zombie": 1}\n',
                                txn=TxnId(producer_name(SHARD), 1, last.history, last.txn + 1))
