"""The scrub on the workers' beat: a planted rotten byte is found within one period,
mended from another store's good copy where one exists, and counted in the metrics."""

from __future__ import annotations

import hashlib
import time
import urllib.request
import uuid
from pathlib import Path

import msgspec

from fragment_store import FileStore, fragment_key, persist_fragment, verify_stored
from fragment_store.scrub import RateLimit
from fragment_store.verified import quarantine_key
from protocol import Codec, Fragment, FragmentSpec, JournalSpec
from tests.fragment_store.rot import flip_byte
from tools.services import CeleryWorkerService, free_port, wait_for

from .workers_support import put_keys

PERIOD = 2.0


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return sum(float(line.split()[-1]) for line in resp.read().decode().splitlines()
                   if line.startswith(name))


def test_the_beat_scrub_finds_rot_within_a_period(redis_db, env, etcd, etcd_root, tmp_path: Path) -> None:  # noqa: ANN001
    primary = FileStore((tmp_path / "primary").as_uri() + "/")
    backup = FileStore((tmp_path / "backup").as_uri() + "/")
    planted = {}
    for name, copy in (("scrub/with-copy", True), ("scrub/alone", False)):
        content = b"".join(b"%s line %d\n" % (name.encode(), i) for i in range(2000))
        f = persist_fragment(primary, Fragment(journal=name, begin=0, end=len(content),
                                               sum=hashlib.sha1(content).hexdigest(),
                                               codec=Codec.ZSTANDARD), content)
        if copy:
            persist_fragment(backup, f, content)
        spec = JournalSpec(name=name, replication=1, fragment=FragmentSpec(
            length=1 << 20, compression_codec=Codec.ZSTANDARD, stores=(primary.url, backup.url)))
        put_keys(etcd, {f"{etcd_root}/journals/{name}": msgspec.json.encode(spec)})
        planted[name] = (f, flip_byte(primary, fragment_key(f)))
    port = free_port()
    svc = CeleryWorkerService(
        f"w{uuid.uuid4().hex[:6]}", redis_url=redis_db.url, queues=("prune",), pool="threads",
        concurrency=1, extra_args=["--beat", "--schedule", str(tmp_path / "beat-schedule")],
        env={**env, "QUIRE_WORKER_SCRUB_INTERVAL": str(PERIOD), "QUIRE_WORKER_METRICS_PORT": str(port)})
    try:
        svc.start()
        started = time.monotonic()
        wait_for(lambda: metric(port, 'quire_scrub_corrupt_total{mended="false"}') >= 1
                 and metric(port, 'quire_scrub_corrupt_total{mended="true"}') >= 1,
                 timeout=PERIOD + 30, what="the scrub's findings in its metrics")
        assert time.monotonic() - started < PERIOD + 30
        assert metric(port, "quire_scrub_fragments_total") >= 2
        assert metric(port, "quire_scrub_bytes_total") >= sum(f.content_length for f, _ in planted.values())
        wait_for(lambda: metric(port, "quire_scrub_last_pass_corrupt") >= 1, timeout=PERIOD + 30,
                 what="a finished pass naming one corrupt copy")
    finally:
        svc.close()
    f, rotten = planted["scrub/with-copy"]
    assert verify_stored(primary, f) == ""  # mended from the backup
    assert primary.read_all(quarantine_key(fragment_key(f))) == rotten
    f, rotten = planted["scrub/alone"]
    assert primary.read_all(fragment_key(f)) == rotten  # kept, failing loudly
    assert primary.read_all(quarantine_key(fragment_key(f))) == rotten


def test_the_rate_limit_paces_a_pass() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    limit = RateLimit(1000, clock=lambda: now[0], sleep=sleep)
    for _ in range(5):
        limit.spend(500)
    assert now[0] == 2.5  # 2500 bytes at 1000 bytes/s
    unlimited = RateLimit(0, clock=lambda: 0.0, sleep=sleep)
    unlimited.spend(10 ** 9)
    assert len(slept) == 5
