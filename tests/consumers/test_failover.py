"""Multi-process: 3 consumer members, 8 count shards over 8 source journals (replication 3
on 3 coordinators), kill -9 of a member while messages stream, and a zombie primary.

What is checked:
- continuously, from etcd: no shard ever has two primary locks or two PRIMARY reports;
- after kill -9 the dead member's shards move (within lease TTL + a few seconds) and the
  new primaries restore from snapshot + recovery-log replay;
- the final per-key counts — rebuilt independently by replaying every shard's recovery
  log into a fresh store — equal the model computed from the input *exactly*. State and
  read offsets commit atomically in one recovery-log record, so a primary killed mid-
  transaction loses its whole open transaction and its successor re-reads exactly those
  messages. (Over-counting could only come from duplicated input appends — the writer
  here never retries an append whose outcome is unknown.) The output journal's last
  total per (shard, key) equals the model too: outputs are exactly-once (each
  transaction's are re-sent by the next primary; test_exactly_once_outputs.py).
- a zombie primary (SIGSTOP past its lease, then SIGCONT) cannot append to its recovery
  log: the successor's fence changed the author register, so its appends are refused;
  it abandons the shard and re-announces itself as a new member.

Load is bounded: QUIRE_CONSUMER_MESSAGES (default 20000; e.g. 200000 for a soak).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import shutil
import signal
import tempfile
import time

import msgspec
import pytest

from consumers.examples.counts import read_counts
from consumers.recoverylog import AUTHOR, RecordReader, replay
from consumers.store import Store
from protocol import LabelSet, parse_selector
from protocol.errors import RegisterMismatch
from protocol.shard import ShardSource, ShardSpec, ShardStatus
from quire.client import Client
from topology.shards import (ShardChange, apply_shards, consumer_root, guard_key, read_primaries,
                             request_checkpoint)

from .conftest import create_journals, journal, wait_for

pytestmark = pytest.mark.timeout(240)

MESSAGES = int(os.environ.get("QUIRE_CONSUMER_MESSAGES", "20000"))
SHARDS = 8
KEYS = 50


def shard_spec(i: int) -> ShardSpec:
    return ShardSpec(id=f"count-{i}", sources=(ShardSource(journal=f"src/part-{i}"),),
                     recovery_log_prefix="recovery", checkpoint_interval=0.25,
                     labels=LabelSet.of(output="out/counts"))


def message(seq: int) -> bytes:
    body = {"key": f"k{seq % KEYS:03d}", "seq": seq}
    line = json.dumps(body)
    return (line[:-1] + ', "pad": "' + "x" * max(0, 96 - len(line)) + '"}\n').encode()


async def setup(env, etcd_client, etcd_root, shards: int) -> None:  # noqa: ANN001
    specs = [journal(f"src/part-{i}", env.store_url) for i in range(shards)]
    specs += [journal(f"recovery/count-{i}", env.store_url) for i in range(shards)]
    specs.append(journal("out/counts", env.store_url))
    await create_journals(env, specs)
    await apply_shards(etcd_client, etcd_root, [ShardChange(spec=shard_spec(i)) for i in range(shards)])


class Watcher:
    """Reads the consumer keys every 50 ms; records any shard with two primaries."""

    def __init__(self, etcd_client, root: str) -> None:  # noqa: ANN001
        self.etcd, self.root = etcd_client, root
        self.violations: list[str] = []
        self.holders: dict[str, set[str]] = collections.defaultdict(set)
        self.polls = 0

    async def run(self) -> None:
        prefix = consumer_root(self.root) + "/"
        while True:
            resp = await self.etcd.get_prefix(prefix.encode())
            locks: dict[str, list[str]] = collections.defaultdict(list)
            primaries: dict[str, list[str]] = collections.defaultdict(list)
            for kv in resp.kvs:
                key = kv.key.decode()[len(prefix):]
                if key.startswith("primary/"):
                    locks[key[len("primary/"):]].append(kv.value.decode())
                elif key.startswith("status/"):
                    st = msgspec.json.decode(kv.value, type=ShardStatus)
                    if st.state.value == "PRIMARY":
                        primaries[st.id].append(st.member)
            for shard, who in {**locks, **primaries}.items():
                if len(locks.get(shard, [])) > 1 or len(primaries.get(shard, [])) > 1:
                    self.violations.append(f"rev {resp.header.revision}: {shard} locks "
                                           f"{locks.get(shard)} primaries {primaries.get(shard)}")
            for shard, who in locks.items():
                self.holders[shard].update(who)
            self.polls += 1
            await asyncio.sleep(0.05)  # sampling another process's state


async def write(client: Client, begin: int, end: int, shards: int, batch: int = 250) -> None:
    for start in range(begin, end, batch * shards):
        by_journal: dict[int, list[bytes]] = collections.defaultdict(list)
        for seq in range(start, min(end, start + batch * shards)):
            by_journal[seq % shards].append(message(seq))
        await asyncio.gather(*(client.append(f"src/part-{j}", b"".join(lines))
                               for j, lines in by_journal.items()))


def model(n: int, shards: int) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = collections.defaultdict(lambda: collections.defaultdict(int))
    for seq in range(n):
        out[f"count-{seq % shards}"][f"k{seq % KEYS:03d}"] += 1
    return {s: dict(c) for s, c in out.items()}


async def replayed_counts(client: Client, shard: str) -> dict[str, int]:
    """A shard's committed state, rebuilt from nothing but its recovery log."""
    directory = tempfile.mkdtemp(prefix="replay-")
    store = Store(os.path.join(directory, "db"))
    try:
        head = await client.write_head(f"recovery/{shard}")
        await replay(client, f"recovery/{shard}", 0, head, store.apply)
        return read_counts(store.items())
    finally:
        store.close()
        shutil.rmtree(directory, ignore_errors=True)


async def caught_up(client: Client, etcd_client, root: str, shards: int) -> bool:  # noqa: ANN001
    from topology.shards import list_statuses

    statuses = await list_statuses(etcd_client, root)
    for i in range(shards):
        head = await client.write_head(f"src/part-{i}")
        st = [s for s in statuses.get(f"count-{i}", []) if s.state.value == "PRIMARY"]
        if len(st) != 1 or not st[0].sources or st[0].sources[0].offset != head:
            return False
    return True


async def diagnosed(waiting, members, etcd_client, root: str):  # noqa: ANN001, ANN201
    """On a timeout, dump the members' stacks (SIGUSR1 -> faulthandler, into their logs)
    and add every shard's lock and status reports to the error."""
    from topology.shards import list_statuses

    try:
        return await waiting
    except AssertionError as exc:
        for m in members:
            m.signal(signal.SIGUSR1)
        statuses = await list_statuses(etcd_client, root)
        locks = await read_primaries(etcd_client, root)
        detail = {s: [(r.member, r.state.value, [(x.offset, x.write_head) for x in r.sources])
                      for r in st] for s, st in sorted(statuses.items())}
        raise AssertionError(f"{exc}\nlocks {locks}\nstatuses {detail}") from None


@contextlib.asynccontextmanager
async def led_group(env, member_factory, etcd_client, root: str, shards: int,  # noqa: ANN001
                    **member_kw):  # noqa: ANN003, ANN201
    """Shards and their journals set up, three members ready, every shard led, and a
    `Watcher` of locks and status reports running: yields (members, watcher)."""
    await setup(env, etcd_client, root, shards)
    members = [member_factory(f"zone-{i % 2}", f"member-{i}", **member_kw) for i in range(3)]
    for m in members:
        await m.ready()
    watcher = Watcher(etcd_client, root)
    watching = asyncio.create_task(watcher.run())
    try:
        async def all_led() -> bool:
            return len(await read_primaries(etcd_client, root)) == shards

        await wait_for(all_led, 30, "every shard to have a primary")
        yield members, watcher
    finally:
        watching.cancel()


async def test_kill9_moves_shards_and_counts_match_model(coordinators, member_factory, etcd_client,  # noqa: ANN001
                                                         etcd_root) -> None:
    env = coordinators
    started = time.monotonic()
    async with Client(env.endpoints) as client:
        async with led_group(env, member_factory, etcd_client, etcd_root, SHARDS,
                             snapshot_interval=1.0) as (members, watcher):
            first = MESSAGES * 2 // 5
            await write(client, 0, first, SHARDS)
            await diagnosed(wait_for(lambda: caught_up(client, etcd_client, etcd_root, SHARDS), 60,
                                     "shards to read the first part"), members, etcd_client, etcd_root)
            locks = await read_primaries(etcd_client, etcd_root)
            counts = collections.Counter(holder for holder, _ in locks.values())
            victim = next(m for m in members if m.id == counts.most_common(1)[0][0])
            moved = sorted(s for s, (holder, _) in locks.items() if holder == victim.id)

            async def snapshotted() -> bool:  # the guard of a log is written after a snapshot
                return all([await etcd_client.get(guard_key(etcd_root, f"recovery/{s}").encode())
                            for s in moved])

            # Each shard about to move takes a snapshot now (a checkpoint notice), so its
            # new primary restores one and replays only the log after it.
            for s in moved:
                await request_checkpoint(etcd_client, etcd_root, s)
            await wait_for(snapshotted, 30, "a snapshot of every shard about to move")
            # Kill -9 while the rest of the input streams in.
            writing = asyncio.create_task(write(client, first, MESSAGES, SHARDS))
            await asyncio.sleep(0.2)  # let some of the stream land before the kill
            victim.signal(signal.SIGKILL)
            killed_at = time.monotonic()
            await writing

            async def moved_away() -> bool:
                now = await read_primaries(etcd_client, etcd_root)
                return all(s in now and now[s][0] != victim.id for s in moved)

            await wait_for(moved_away, 20, "the killed member's shards to move")
            move_time = time.monotonic() - killed_at
            await wait_for(lambda: caught_up(client, etcd_client, etcd_root, SHARDS), 90,
                           "shards to read everything")
            survivors = [m for m in members if m is not victim]
            restored = "".join(m.log_text() for m in survivors)
            assert "snapshot restored" in restored, "the new primaries started from a snapshot"
            for m in survivors:
                assert m.terminate() == 0, m.log_text()[-3000:]
        assert watcher.polls > 20
        assert not watcher.violations, watcher.violations[:5]
        assert all(len(watcher.holders[s]) >= 2 for s in moved), dict(watcher.holders)
        expected = model(MESSAGES, SHARDS)
        for i in range(SHARDS):
            assert await replayed_counts(client, f"count-{i}") == expected[f"count-{i}"], f"count-{i}"
        # The output journal: its last total per (shard, key) is the state, every one.
        published: dict[tuple[str, str], int] = {}
        head = await client.write_head("out/counts")
        async for _, data in client.read("out/counts", 0, end_offset=head):
            for line in data.splitlines():
                row = json.loads(line)
                published[(row["shard"], row["key"])] = row["count"]
        assert published == {(s, k): n for s, counts in expected.items() for k, n in counts.items()}
    print(f"\n{MESSAGES} messages, {len(moved)} shards moved in {move_time:.1f}s after kill -9, "
          f"total {time.monotonic() - started:.1f}s")


async def test_zombie_primary_cannot_append_to_its_recovery_log(coordinators, member_factory,  # noqa: ANN001
                                                                etcd_client, etcd_root) -> None:
    env = coordinators
    await setup(env, etcd_client, etcd_root, 1)
    zombie = member_factory("zone-a", "zombie", snapshot_interval=1.0)
    await zombie.ready()
    async with Client(env.endpoints) as client:
        async def led_by(member) -> object:  # noqa: ANN001
            holder = (await read_primaries(etcd_client, etcd_root)).get("count-0")
            return holder if holder and holder[0] == member.id else None

        _, lock_rev = await wait_for(lambda: led_by(zombie), 20, "the first primary")
        zombie_author = f"zone-a.zombie.{lock_rev}"
        await write(client, 0, 2000, 1)
        await wait_for(lambda: caught_up(client, etcd_client, etcd_root, 1), 30, "the first part")
        # Pause it with input pending, past its lease (TTL 3 s).
        await write(client, 2000, 3000, 1)
        zombie.signal(signal.SIGSTOP)
        successor = member_factory("zone-b", "successor", snapshot_interval=1.0)
        try:
            await successor.ready(timeout=30)
            await wait_for(lambda: led_by(successor), 20, "the successor to take the lock")
            await wait_for(lambda: caught_up(client, etcd_client, etcd_root, 1), 30, "the successor")
            # The zombie's author no longer matches the register: its appends are refused.
            with pytest.raises(RegisterMismatch):
                await client.append("recovery/count-0", b"\x00\x00\x00\x00",
                                     check_registers=parse_selector(f"{AUTHOR}={zombie_author}"))
        finally:
            zombie.signal(signal.SIGCONT)
        # It notices its lost membership, abandons the shard without writing, re-announces.
        await wait_for(lambda: "membership lost; abandoning every shard" in zombie.log_text()
                       and "re-announced" in zombie.log_text(), 30, "the zombie to step down")
        assert zombie.proc.poll() is None, zombie.log_text()[-3000:]
        await write(client, 3000, 4000, 1)
        await wait_for(lambda: caught_up(client, etcd_client, etcd_root, 1), 30, "the last part")
        assert zombie.terminate() == 0 and successor.terminate() == 0
        # No record of the zombie's follows the successor's fence in the log.
        head = await client.write_head("recovery/count-0")
        reader, authors = RecordReader(0), []
        async for at, data in client.read("recovery/count-0", 0, end_offset=head):
            authors += [(r.author, r.fence) for r, _ in reader.feed(at, data)]
        fenced_at = next(i for i, (a, f) in enumerate(authors) if f and a.startswith("zone-b.successor"))
        assert all(a != zombie_author for a, _ in authors[fenced_at:]), authors
        assert await replayed_counts(client, "count-0") == model(4000, 1)["count-0"]
