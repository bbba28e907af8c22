"""The consumer group of a chaos run: count shards over source journals of their own.

    setup:   source journals `chaos/events/p-NNN`, recovery logs `chaos/recovery/<shard>`
             and the output journal `chaos/counts/totals` (replication as the run's
             journals); one ShardSpec per source (`chaos-count-N`, one hot standby,
             output label) applied in etcd; M member processes of
             `python -m consumers.main run consumers.examples.counts:Counts` in the run's
             zones, each a `Service` so the nemesis can kill -9, restart, SIGSTOP and
             SIGCONT it like a coordinator.
    run:     event writers append batches of JSON lines `{"key", "w", "s"}` to the
             sources through the same faulted client links as the broker writers;
             `watch` polls the consumer keys in etcd (dual primaries, primary changes).
    finish:  after healing, wait (bounded) until every shard's *committed* read-through
             offset - from its recovery log, replayed here - reaches its source's head;
             read the sources and the output journal back; `consumer_check.check_consumers`
             compares.

The sources are the group's own (not the broker checker's `q1` records, which are not
JSON and which Counts would skip): the model is then exactly "count the keys of the
lines below the committed offset". Whether an event append was acknowledged does not
matter: the model is the journal content itself.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import structlog

from consumers.recoverylog import RecordReader
from protocol import FragmentSpec, JournalSpec, LabelSet
from protocol.labels import CONTENT_TYPE, RECOVERY_LOG
from protocol.shard import ShardSource, ShardSpec, ShardStatus
from quire.client import Client
from tools.services import Service
from topology.etcd import connect
from topology.shards import ShardChange, apply_shards, consumer_root, read_primaries

from .consumer_check import PrimaryWatch, ShardReadback
from .readback import final_read

__all__ = ["ConsumerGroup", "ConsumerService", "GroupConfig"]

log = structlog.get_logger("chaos.consumers")

APP = "consumers.examples.counts:Counts"
OUTPUT = "chaos/counts/totals"
KEYS = 40


class ConsumerService(Service):
    """One `quire consumer run` member; ready once it printed `ready <id>`."""

    ready_timeout = 60.0
    stop_timeout = 30.0

    def __init__(self, name: str, *, zone: str, suffix: str, etcd_url: str, root: str,
                 brokers: list[str], ttl: float, snapshot_interval: float,
                 env: dict[str, str], workdir: Path) -> None:
        super().__init__(name, env={"PYTHONUNBUFFERED": "1", **env}, workdir=workdir)
        self.zone, self.suffix = zone, suffix
        self.argv = [sys.executable, "-m", "consumers.main", "run", APP, "--etcd", etcd_url,
                     "--root", root, "--zone", zone, "--id", suffix, "--broker", ",".join(brokers),
                     "--data-dir", str(workdir / "data"), "--ttl", f"{ttl:g}",
                     "--snapshot-interval", f"{snapshot_interval:g}", "--log-format", "json"]

    @property
    def member_id(self) -> str:
        return f"{self.zone}#{self.suffix}"

    def build_argv(self) -> list[str]:
        return list(self.argv)

    def probe(self) -> bool:
        return f"ready {self.member_id}" in self.log_text()


@dataclass
class GroupConfig:
    members: int = 3
    shards: int = 4
    rate: float = 20.0
    """Event appends per second, all sources together."""
    lines: int = 10
    """JSON lines per event append."""
    ttl: float = 5.0
    """Member lease TTL (seconds)."""
    snapshot_interval: float = 3.0
    checkpoint_interval: float = 0.5
    finish_timeout: float = 120.0
    """Bound on the wait for every shard's committed offset to reach its source's head."""
    stall_timeout: float = 20.0
    """...and the wait ends sooner once no shard's committed offset moved for this long
    (a shard that is stuck - e.g. its recovery log refuses appends - will not catch up)."""


@dataclass
class ConsumerGroup:
    cfg: GroupConfig
    seed: int
    replication: int
    zones: tuple[str, ...]
    services: list[ConsumerService] = field(default_factory=list)
    watch: PrimaryWatch = field(default_factory=PrimaryWatch)
    appends: dict[str, int] = field(default_factory=lambda: {"ok": 0, "failed": 0})
    etcd_url: str = ""
    root: str = "/quire"
    output: bytes | None = None
    """The output journal as read back by `finish` (None if it could not be read)."""

    @property
    def shard_ids(self) -> list[str]:
        return [f"chaos-count-{i}" for i in range(self.cfg.shards)]

    @property
    def sources(self) -> list[str]:
        return [f"chaos/events/p-{i:03d}" for i in range(self.cfg.shards)]

    def spec(self, i: int) -> ShardSpec:
        return ShardSpec(id=self.shard_ids[i], sources=(ShardSource(journal=self.sources[i]),),
                         recovery_log_prefix="chaos/recovery", hot_standbys=1,
                         checkpoint_interval=self.cfg.checkpoint_interval,
                         labels=LabelSet.of(output=OUTPUT))

    # -- setup ---------------------------------------------------------------------------

    async def start(self, admin: Client, *, etcd_url: str, root: str, store_url: str,
                    brokers: list[str], env: dict[str, str], workdir: Path,
                    hosts: list[Any] | None = None) -> None:
        """`hosts`: member i runs on hosts[i] (tools.hosts), else on this machine."""
        self.etcd_url, self.root = etcd_url, root
        fragment = FragmentSpec(length=64 << 10, stores=(store_url,), refresh_interval=5.0)
        journals = [JournalSpec(name=n, replication=self.replication, fragment=fragment)
                    for n in [*self.sources, OUTPUT]]
        journals += [JournalSpec(name=self.spec(i).recovery_log, replication=self.replication,
                                 fragment=fragment, labels=LabelSet.of({CONTENT_TYPE: RECOVERY_LOG}))
                     for i in range(self.cfg.shards)]
        await admin.apply(journals)
        etcd = await connect(etcd_url)
        try:
            await apply_shards(etcd, root, [ShardChange(spec=self.spec(i))
                                            for i in range(self.cfg.shards)])
        finally:
            await etcd.close()
        for i in range(self.cfg.members):
            self.services.append(ConsumerService(
                f"consumer-{i}", zone=self.zones[i % len(self.zones)], suffix=f"consumer{i}",
                etcd_url=etcd_url, root=root, brokers=brokers, ttl=self.cfg.ttl,
                snapshot_interval=self.cfg.snapshot_interval, env=env,
                workdir=workdir / f"consumer-{i}"))
            if hosts:
                hosts[i % len(hosts)].adopt(self.services[-1])
        for svc in self.services:
            svc.start(wait=False)
        for svc in self.services:
            await asyncio.to_thread(svc.wait_ready)
        deadline = time.monotonic() + 60.0
        while len(await self._primaries()) < self.cfg.shards:
            if time.monotonic() > deadline:
                raise RuntimeError("consumer shards did not all get a primary within 60 s")
            await asyncio.sleep(0.5)  # other processes' state, polled with a deadline

    async def _primaries(self) -> dict[str, tuple[str, int]]:
        etcd = await connect(self.etcd_url, timeout=5.0)
        try:
            return await asyncio.wait_for(read_primaries(etcd, self.root), 5.0)
        finally:
            await etcd.close()

    async def primary_of(self, shard: int) -> tuple[str, Service | None]:
        """The member holding the shard's lock; when none can be read (etcd paused, the
        shard between primaries), member `shard % members`: a consumer fault still hits
        a consumer member rather than being skipped."""
        shard_id = self.shard_ids[shard % self.cfg.shards]
        try:
            holder = (await self._primaries()).get(shard_id, ("", 0))[0]
        except Exception as exc:  # noqa: BLE001 - etcd faulted: fall back below
            log.warning("consumers.primaries_unreadable", error=repr(exc))
            holder = ""
        found = next((s for s in self.services if s.member_id == holder), None)
        if found is None:
            return f"{shard_id} (no primary seen)", self.services[shard % len(self.services)]
        return shard_id, found

    def close(self) -> None:
        for svc in self.services:
            try:
                svc.stop(timeout=10)
            except Exception as exc:  # noqa: BLE001 - best effort at the end of a run
                log.warning("consumers.stop_failed", service=svc.name, error=str(exc))

    # -- during the run ------------------------------------------------------------------

    async def write(self, i: int, client: Client, stop: asyncio.Event) -> None:
        """Append batches of JSON lines to source i until `stop` (failures are counted and
        not retried: the model is whatever the journal holds)."""
        rng = random.Random(f"events-{self.seed}-{i}")
        journal = self.sources[i]
        interval = self.cfg.shards / self.cfg.rate
        next_t = time.monotonic()
        seq = 0
        while not stop.is_set():
            lines = []
            for _ in range(self.cfg.lines):
                seq += 1
                lines.append(b'{"key":"k%02d","w":%d,"s":%d}\n' % (rng.randrange(KEYS), i, seq))
            try:
                await asyncio.wait_for(client.append(journal, b"".join(lines), retry_timeout=10.0),
                                       20.0)
                self.appends["ok"] += 1
            except Exception:  # noqa: BLE001 - counted; the next batch goes on
                self.appends["failed"] += 1
            next_t += interval
            now = time.monotonic()
            if next_t < now - 1.0:
                next_t = now  # fell behind during a fault: do not burst afterwards
            await asyncio.sleep(max(0.0, next_t - now))

    async def watch_primaries(self, interval: float = 0.2) -> None:
        """Poll every consumer key (one consistent snapshot per poll) until cancelled."""
        prefix = consumer_root(self.root) + "/"
        etcd = None
        try:
            while True:
                try:
                    if etcd is None:
                        etcd = await connect(self.etcd_url, timeout=2.0)
                    resp = await asyncio.wait_for(etcd.get_prefix(prefix.encode()), 2.0)
                except asyncio.CancelledError:
                    raise
                except Exception:  # noqa: BLE001 - etcd faulted: the next poll reconnects
                    self.watch.failed_polls += 1
                    if etcd is not None:
                        old, etcd = etcd, None
                        asyncio.ensure_future(_close_quietly(old))
                    await asyncio.sleep(interval)
                    continue
                locks: dict[str, str] = {}
                primaries: list[tuple[str, str]] = []
                for kv in resp.kvs:
                    key = kv.key.decode()[len(prefix):]
                    if key.startswith("primary/"):
                        locks[key[len("primary/"):]] = kv.value.decode()
                    elif key.startswith("status/"):
                        try:
                            st = msgspec.json.decode(kv.value, type=ShardStatus)
                        except (msgspec.DecodeError, msgspec.ValidationError):
                            continue
                        if st.state.value == "PRIMARY":
                            primaries.append((st.id, st.member))
                self.watch.observe(int(resp.header.revision), locks, primaries)
                await asyncio.sleep(interval)  # sampling other processes' state
        finally:
            if etcd is not None:
                await _close_quietly(etcd)

    # -- after the run -------------------------------------------------------------------

    async def finish(self, admin: Client) -> tuple[list[ShardReadback], dict[str, Any]]:
        """Replay every recovery log until each shard's committed offset reaches its
        source's head (bounded by `finish_timeout`, or `stall_timeout` without progress),
        then read the sources back."""
        t0 = time.monotonic()
        deadline = t0 + self.cfg.finish_timeout
        shards = [ShardReadback(self.shard_ids[i], self.sources[i], b"")
                  for i in range(self.cfg.shards)]
        readers = [_LogFeed(self.spec(i).recovery_log) for i in range(len(shards))]
        heads: dict[str, int] = {}
        last_progress: tuple[int, ...] = ()
        moved_at = t0
        while True:
            for sh, feed in zip(shards, readers):
                try:
                    heads[sh.source] = await asyncio.wait_for(admin.write_head(sh.source), 20.0)
                    sh.log_head = await asyncio.wait_for(admin.write_head(feed.journal), 20.0)
                    await asyncio.wait_for(feed.run(admin, sh), 60.0)
                    sh.log_error = ""
                except Exception as exc:  # noqa: BLE001 - retried until the deadline, then reported
                    sh.log_error = f"{type(exc).__name__}: {exc}"[:300]
            if all(not sh.log_error and sh.log.offset(sh.source) >= heads.get(sh.source, 0)
                   for sh in shards) or time.monotonic() > deadline:
                break
            progress = tuple(sh.log.offset(sh.source) for sh in shards)
            if progress != last_progress:
                last_progress, moved_at = progress, time.monotonic()
            elif time.monotonic() - moved_at > self.cfg.stall_timeout:
                break  # no shard committed anything for a while: it will not catch up
            await asyncio.sleep(1.0)  # the members commit within their checkpoint interval
        caught_up = round(time.monotonic() - t0, 1)
        for sh in shards:
            rb = await final_read(admin, sh.source)
            sh.source_data, sh.source_begin = rb.final, rb.final_begin
            sh.source_error = rb.read_error
        out = await final_read(admin, OUTPUT)
        self.output = None if out.read_error else out.final
        meta = {"caught_up_seconds": caught_up, "event_appends": dict(self.appends),
                "watch_failed_polls": self.watch.failed_polls,
                "primary_changes": dict(sorted(self.watch.changes.items())),
                "members": [s.member_id for s in self.services]}
        return shards, meta


@dataclass
class _LogFeed:
    """A recovery log read incrementally into a ShardReadback's LogState."""

    journal: str
    fed: int = 0
    """Offset of the next byte to read (bytes below were fed to `records`)."""
    records: RecordReader = field(default_factory=lambda: RecordReader(0))

    async def run(self, admin: Client, sh: ShardReadback) -> None:
        if sh.log_head <= self.fed:
            return
        async for offset, data in admin.read(self.journal, self.fed, end_offset=sh.log_head):
            for record, end in self.records.feed(offset, data):
                sh.log.apply(record, end)
            self.fed = offset + len(data)
            if self.fed >= sh.log_head:
                return


async def _close_quietly(etcd: Any) -> None:
    try:
        await asyncio.wait_for(etcd.close(), 2.0)
    except Exception:  # noqa: BLE001 - a client of a faulted etcd
        pass
