"""`quire up --tls --auth`: coordinators serve mTLS from a local CA and check tokens; the
CLI (with the printed QUIRE_TLS_* and QUIRE_TOKEN) appends, the worker persists over TLS
with the services' token, a plain probe and a token-less CLI are refused."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools.local_cluster import hello_probe
from tools.services import free_port

pytestmark = pytest.mark.timeout(300)


def test_up_with_tls_and_auth(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = subprocess.Popen([sys.executable, "-m", "tools.cli.main", "up", "-n", "2", "--tls", "--auth",
                             "--data-dir", str(data), "--port", str(free_port()), "-o", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        info = None
        deadline = time.monotonic() + 120
        while info is None and time.monotonic() < deadline and proc.poll() is None:
            if select.select([proc.stdout], [], [], 1.0)[0]:
                line = proc.stdout.readline()
                info = json.loads(line) if line else None
        assert info is not None, proc.stderr.read().decode()[-2000:] if proc.poll() is not None else ""
        tls = info["tls"]
        assert set(tls) == {"QUIRE_TLS_CA", "QUIRE_TLS_CERT", "QUIRE_TLS_KEY", "QUIRE_TLS_CLIENT_AUTH"}
        assert oct(os.stat(tls["QUIRE_TLS_KEY"]).st_mode & 0o777) == "0o600"
        endpoint = info["broker"].split(",")[0]
        try:  # plain TCP gets no HelloAck
            answered = hello_probe(endpoint, timeout=3.0)
        except OSError:
            answered = False
        assert not answered
        auth = info["auth"]
        assert oct(os.stat(auth["keys_file"]).st_mode & 0o777) == "0o600"
        env = {**os.environ, "QUIRE_BROKER": info["broker"], **tls}
        anonymous = subprocess.run([sys.executable, "-m", "tools.cli.main", "journals", "list"],
                                   capture_output=True, env=env, timeout=60)
        assert anonymous.returncode == 5 and b"UNAUTHORIZED" in anonymous.stderr
        env["QUIRE_TOKEN"] = auth["token"]

        def cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "tools.cli.main", *args], input=stdin,
                                  capture_output=True, env=env, timeout=60)

        specs = tmp_path / "s.yaml"
        specs.write_text(f"name: tls/kept\nreplication: 2\nfragment:\n  length: 1KiB\n"
                         f"  refresh_interval: 1s\n  stores: [{info['store']}]\n")
        assert cli("journals", "apply", "-f", str(specs)).returncode == 0
        line = b"y" * 1500 + b"\n"
        deadline = time.monotonic() + 30
        while True:  # the first append waits for the allocator
            res = cli("append", "-j", "tls/kept", stdin=line)
            if res.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert res.returncode == 0, res.stderr
        assert cli("append", "-j", "tls/kept", stdin=line).returncode == 0  # rolls the first
        persisted, deadline = False, time.monotonic() + 60
        while not persisted and time.monotonic() < deadline:  # the worker fetched over TLS
            frags = [json.loads(ln) for ln in cli("fragments", "list", "-j", "tls/kept",
                                                  "-o", "json").stdout.splitlines()]
            persisted = any(f["persisted"] for f in frags)
            time.sleep(0.5)
        assert persisted, "nothing was persisted within 60s"
        assert cli("read", "-j", "tls/kept", "--end-offset", str(len(line))).stdout == line
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
