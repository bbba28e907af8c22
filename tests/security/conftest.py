"""One real `quire up --secure` cluster for the security suite (started once per module)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

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
