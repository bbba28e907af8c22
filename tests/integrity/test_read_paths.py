"""Rot in the store never reaches a reader through a coordinator: a cold read (the
coordinator streams a persisted fragment), `quire read --from-store` (the client proves
it, else asks the coordinator) and a consumer's recovery-log replay (a read through the
coordinator). For codecs none, gzip and zstd: with a good copy in the journal's other
store the content comes back right and the rotten object is quarantined and mended;
without one, FRAGMENT_CORRUPT names the fragment and not a byte of it is returned."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from consumers.recoverylog import Record, encode_record, replay
from fragment_store import FileStore, fragment_key, fragment_name, verify_stored
from fragment_store.verified import quarantine_key
from protocol import Status
from protocol.errors import StatusError
from protocol.fragment import Codec, Fragment
from quire.client import Client
from tests.coordinator.cluster import until
from tests.fragment_store.rot import ROT_CODECS, flip_byte
from tests.integrity.planted import cold_read, plant, served, serving
from tools.services import RedisService

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]


def log_content(n: int, tag: str) -> bytes:
    return b"".join(encode_record(Record(author=tag, ops=[(b"k%d" % i, b"%s-%d" % (tag.encode(), i))]))
                    for i in range(n))


def cli(endpoint: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "QUIRE_BROKER": endpoint}
    return subprocess.run([sys.executable, "-m", "tools.cli.main", *args], capture_output=True,
                          env=env, timeout=60, cwd=ROOT)


async def replayed(endpoint: str, journal: str, end: int) -> list[tuple[bytes, bytes | None]]:
    ops: list[tuple[bytes, bytes | None]] = []
    async with Client([endpoint]) as client:
        await replay(client, journal, 0, end, lambda batch, _end: ops.extend(batch))
    return ops


async def test_coordinator_cli_and_replay_reads_never_pass_rot(etcd, etcd_root, tmp_path: Path) -> None:  # noqa: ANN001
    primary = FileStore((tmp_path / "primary").as_uri() + "/")
    backup = FileStore((tmp_path / "backup").as_uri() + "/")
    cases = []  # (journal, fragment, content, has a good copy elsewhere)
    with RedisService("redis-integrity") as rds:
        r = redis.Redis.from_url(rds.url)
        specs = []
        for codec in ROT_CODECS:
            for good_copy in (True, False):
                j = f"integrity/{codec}-{'copy' if good_copy else 'alone'}"
                content = log_content(400, j)
                f = Fragment(journal=j, begin=0, end=len(content), codec=Codec(codec),
                             sum=hashlib.sha1(content).hexdigest())
                case, spec = plant(primary, backup, r, j, codec, content, [f], good_copy)
                cases.append((j, case.fragments[0], content, good_copy))
                specs.append(spec)
        async with serving(etcd.url, etcd_root, rds.url, specs) as node:
            for j, f, content, _ in cases:  # every replica has loaded its index
                await until(lambda j=j, f=f: served(node.endpoint, j, f.end), 60, f"{j} served")
            for j, f, content, good_copy in cases:
                key = fragment_key(f)
                rotten = flip_byte(primary, key)
                # 1. A coordinator's cold read.
                data, metas = await cold_read(node.endpoint, j, f.end)
                if good_copy:
                    assert data == content, j
                    assert primary.read_all(quarantine_key(key)) == rotten
                    assert verify_stored(primary, f) == "", "the rotten object was mended"
                else:
                    assert data == b"", j  # not one byte of it
                    assert metas[-1].status == Status.FRAGMENT_CORRUPT
                    assert fragment_name(f) in metas[-1].message and j in metas[-1].message
                    assert primary.read_all(quarantine_key(key)) == rotten
                # 2. `quire read --from-store`.
                primary.put(key, rotten)
                out = cli(node.endpoint, "read", "-j", j, "--from-store", "--end-offset", str(f.end))
                if good_copy:
                    assert out.returncode == 0, out.stderr
                    assert out.stdout == content
                    assert verify_stored(primary, f) == ""
                else:
                    assert out.returncode == 10, out.stderr
                    assert rotten not in out.stdout and out.stdout == b""
                    assert fragment_name(f).encode() in out.stderr
                # 3. A consumer's recovery-log replay (reads through the coordinator).
                primary.put(key, rotten)
                if good_copy:
                    ops = await replayed(node.endpoint, j, f.end)
                    assert ops == [(b"k%d" % i, b"%s-%d" % (j.encode(), i)) for i in range(400)]
                    assert verify_stored(primary, f) == ""
                else:
                    with pytest.raises(StatusError) as err:
                        await replayed(node.endpoint, j, f.end)
                    assert err.value.status == Status.FRAGMENT_CORRUPT
                    assert fragment_name(f) in str(err.value)
            # 4. `quire fragments verify`: the copies without a good copy are named, exit 10.
            out = cli(node.endpoint, "fragments", "verify")
            assert out.returncode == 10, out.stderr
            for j, f, _, good_copy in cases:
                assert (fragment_key(f).encode() in out.stderr) is not good_copy, j
            ok = cli(node.endpoint, "fragments", "verify", "-j", cases[0][0])
            assert ok.returncode == 0 and b"0 rotten copies" in ok.stdout, ok.stdout + ok.stderr

