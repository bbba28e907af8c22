"""One real `quire up --secure` cluster for the security suite (started once per module)."""

from __future__ import annotations

import base64
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from protocol.auth import Keyring
from protocol.credentials import load_keyring

from tools.services import free_port

# Spark's Python data-source workers are started from the JVM's environment, set before
# the session's JVM starts (as tests/spark/conftest.py does).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


@dataclass
class SecureCluster:
    info: dict[str, Any]
    data: Path
    proc: subprocess.Popen
    ports: dict[str, Any] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        """What an operator exports from `quire up --secure`'s output."""
        return {**os.environ, "QUIRE_BROKER": self.info["broker"], **self.info["tls"],
                "QUIRE_TOKEN": self.info["auth"]["token"],
                "QUIRE_AUTH_KEYS_FILE": self.info["auth"]["keys_file"], **self.info["secure"],
                "COLUMNS": "250"}

    def cli(self, *args: str, env: dict[str, str] | None = None, stdin: bytes | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "tools.cli.main", *args], input=stdin,
                              capture_output=True, env=env or self.env, timeout=timeout)

    def worker_metrics(self) -> str:
        import urllib.request

        url = f"http://127.0.0.1:{self.ports['worker_metrics']}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.read().decode()

    def store_files(self, journal: str) -> set[str]:
        """Every file of `journal` in the cluster's file store, relative to its directory."""
        root = self.data / "fragments" / journal
        return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()} if root.exists() else set()

    def persisted(self, journal: str) -> bool:
        out = self.cli("fragments", "list", "-j", journal, "-o", "json").stdout.splitlines()
        return any(json.loads(ln)["persisted"] for ln in out)

    def refused_count(self, task: str, reason: str) -> float:
        pattern = (rf'quire_worker_refused_tasks_total\{{reason="{reason}",task="{re.escape(task)}"\}} '
                   r"([0-9.e+]+)")
        m = re.search(pattern, self.worker_metrics())
        return float(m.group(1)) if m else 0.0

    def keyring(self) -> Keyring:
        ring = load_keyring(None, self.info["auth"]["keys_file"])
        assert ring is not None
        return ring

    def shard_row(self, shard: str) -> dict | None:
        listed = self.cli("shards", "list", "-o", "json")
        rows = [json.loads(ln) for ln in listed.stdout.splitlines() if ln.strip()]
        return next((r for r in rows if r["id"] == shard), None)

    # -- Redis, as each of its users ----------------------------------------------------------

    @property
    def redis_port(self) -> int:
        return int(self.ports["redis"])

    def queue_len(self, queue: str) -> int:
        return int(redis.Redis.from_url(self.info["secure"]["QUIRE_REDIS_URL"]).llen(queue))

    def push_as_worker(self, queue: str, message: bytes) -> None:
        """LPUSH `message` as the workers' Redis user: what anyone with its password can do."""
        password = (self.data / "secure" / "redis-worker.password").read_text().strip()
        url = (f"rediss://quire-worker:{password}@127.0.0.1:{self.redis_port}/0"
               f"?ssl_ca_certs={self.info['tls']['QUIRE_TLS_CA']}")
        redis.Redis.from_url(url).lpush(queue, message)


def forged_message(task: str, args: list, kwargs: dict, queue: str, headers: dict | None = None) -> bytes:
    """A Celery protocol-2 message made by hand: what anyone with Redis access can push."""
    tid = str(uuid.uuid4())
    body = base64.b64encode(json.dumps([args, kwargs, {"callbacks": None, "errbacks": None,
                                                       "chain": None, "chord": None}]).encode())
    return json.dumps({
        "body": body.decode(), "content-encoding": "utf-8", "content-type": "application/json",
        "headers": {"lang": "py", "task": task, "id": tid, "root_id": tid, "parent_id": None,
                    "group": None, "retries": 0, "eta": None, "expires": None, "timelimit": [None, None],
                    "argsrepr": repr(args), "kwargsrepr": repr(kwargs), "origin": "forger",
                    "ignore_result": False, **(headers or {})},
        "properties": {"correlation_id": tid, "reply_to": "", "delivery_mode": 2,
                       "delivery_info": {"exchange": "", "routing_key": queue}, "priority": 0,
                       "body_encoding": "base64", "delivery_tag": str(uuid.uuid4())},
    }).encode()


@pytest.fixture(scope="module")
def secure_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureCluster]:
    data = tmp_path_factory.mktemp("secure") / "data"
    env = {**os.environ, "QUIRE_WORKER_PULSE_INTERVAL": "2",
           "QUIRE_WORKER_INDEX_SWEEP_INTERVAL": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "tools.cli.main", "up", "-n", "2", "--secure",
                             "--data-dir", str(data), "--port", str(free_port()), "-o", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        info = None
        deadline = time.monotonic() + 180
        while info is None and time.monotonic() < deadline and proc.poll() is None:
            if select.select([proc.stdout], [], [], 1.0)[0]:
                line = proc.stdout.readline()  # type: ignore[union-attr]
                info = json.loads(line) if line else None
        if info is None:
            err = proc.stderr.read().decode()[-3000:] if proc.poll() is not None else ""  # type: ignore[union-attr]
            raise AssertionError(f"quire up --secure did not come up: {err}")
        ports = json.loads((data / "cluster.json").read_text())
        yield SecureCluster(info, data, proc, ports)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
