"""Issue #51, "errors that name the cause".

* A `quire up --tls` coordinator requires client certificates: a client with none, with
  one of another CA, or speaking plain TCP, is told which of these it is and the
  variable to set — not `coordinator unreachable … connection closed by peer`.
* `quire env` while `quire up` is still starting says so (not "no local cluster
  running"), and `quire env --wait` waits, bounded, until the cluster is up: once with a
  run record held by this test (the state `quire up` keeps, tools/cluster_run.py, so the
  "starting" moment lasts as long as the test needs), once with a real `quire up`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol.discovery import ENV_FILE, format_env
from tools.cluster_run import RunDir
from tools.services import QuireUpService, Service, wait_for
from tools.tls_certs import make_local_ca

pytestmark = pytest.mark.timeout(300)


def quire(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tools.cli.main", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, check=False)


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def tls_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[QuireUpService]:
    data = tmp_path_factory.mktemp("tls") / "data"
    with QuireUpService(data, "--tls", env={"QUIRE_DATA_DIR": ""}) as up:
        yield up


def client_env(up: QuireUpService, home: Path, **tls: str) -> dict[str, str]:
    """A fresh shell pointed at the cluster by QUIRE_BROKER alone, plus `tls`."""
    return {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
            "QUIRE_DISCOVER": "0", "QUIRE_BROKER": up.variables["QUIRE_BROKER"], **tls}


def test_tls_without_a_client_certificate_names_the_variables(tls_up: QuireUpService, tmp_path: Path) -> None:
    out = quire("journals", "list", env=client_env(tls_up, tmp_path,
                                                   QUIRE_TLS_CA=tls_up.variables["QUIRE_TLS_CA"]))
    assert out.returncode == 6
    line = one_line(out)
    assert "TLS handshake refused" in line and "requires a client certificate" in line, line
    assert "none was presented" in line and "QUIRE_TLS_CERT and QUIRE_TLS_KEY" in line, line
    assert "closed by peer" not in line and "QUIRE_BROKER" not in line, line


def test_tls_with_an_untrusted_client_certificate_says_so(tls_up: QuireUpService, tmp_path: Path) -> None:
    other = make_local_ca(tmp_path / "other-ca")  # a certificate the cluster's CA never signed
    out = quire("journals", "list", env=client_env(
        tls_up, tmp_path, QUIRE_TLS_CA=tls_up.variables["QUIRE_TLS_CA"],
        QUIRE_TLS_CERT=other.cert, QUIRE_TLS_KEY=other.key))
    assert out.returncode == 6
    line = one_line(out)
    assert "did not accept the client certificate presented" in line, line
    assert "QUIRE_TLS_CERT and QUIRE_TLS_KEY" in line, line


def test_plain_tcp_at_a_tls_coordinator_names_the_ca_variable(tls_up: QuireUpService, tmp_path: Path) -> None:
    out = quire("journals", "list", env=client_env(tls_up, tmp_path))
    assert out.returncode == 6
    line = one_line(out)
    assert "serving TLS" in line and "QUIRE_TLS_CA" in line, line


def test_the_cluster_s_own_certificate_is_answered(tls_up: QuireUpService, tmp_path: Path) -> None:
    v = tls_up.variables
    out = quire("journals", "list", env=client_env(tls_up, tmp_path, QUIRE_TLS_CA=v["QUIRE_TLS_CA"],
                                                   QUIRE_TLS_CERT=v["QUIRE_TLS_CERT"],
                                                   QUIRE_TLS_KEY=v["QUIRE_TLS_KEY"]))
    assert out.returncode == 0, out.stderr


# -- quire env during start-up ------------------------------------------------------------

def env_of(data: Path, home: Path) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "HOME": str(home), "QUIRE_DATA_DIR": str(data),
            "PYTHONPATH": os.environ.get("PYTHONPATH", "")}


def test_quire_env_says_starting_and_waits(tmp_path: Path) -> None:
    data = tmp_path / "data"
    run = RunDir(data)
    run.acquire()  # this process is the `quire up` of `data`, still starting
    try:
        run.set_state("starting")
        out = quire("env", env=env_of(data, tmp_path))
        assert out.returncode == 6
        line = one_line(out)
        assert f"the local cluster in {data} is starting" in line, line
        assert f"quire up (pid {os.getpid()})" in line and "quire env --wait" in line, line
        assert "no local cluster running" not in line

        bounded = quire("env", "--wait", "--wait-timeout", "1", env=env_of(data, tmp_path))
        assert bounded.returncode == 6 and "still starting after 1s" in one_line(bounded)

        waiter = Service("env-wait", [sys.executable, "-m", "tools.cli.main", "env", "--wait",
                                      "--wait-timeout", "120"],
                         env=env_of(data, tmp_path), workdir=tmp_path / "waiter").start()
        time.sleep(0.5)  # (it may look while still starting; either way it must wait)
        assert waiter.running
        (data / ENV_FILE).write_text(format_env({"QUIRE_BROKER": "127.0.0.1:1"}, os.getpid(), data))
        run.set_state("up")
        wait_for(lambda: not waiter.running, timeout=60, what="quire env --wait to return")
        assert waiter.returncode == 0, waiter.log_text()
        assert "export QUIRE_BROKER=127.0.0.1:1" in waiter.log_text()
        waiter.close()
    finally:
        (data / ENV_FILE).unlink(missing_ok=True)  # as quire up's stop does
        run.release()
    after = quire("env", env=env_of(data, tmp_path))
    assert after.returncode == 6 and "no local cluster running" in one_line(after)


def test_quire_env_wait_with_a_real_quire_up(tmp_path: Path) -> None:
    data = tmp_path / "data"
    up = QuireUpService(data, env={"QUIRE_DATA_DIR": ""})
    try:
        up.start(wait=False)
        out = quire("env", "--wait", "--wait-timeout", "180", env=env_of(data, tmp_path), timeout=240)
        assert out.returncode == 0, out.stderr
        assert f"export QUIRE_BROKER=127.0.0.1:{up.port}" in out.stdout
        assert up.running
    finally:
        up.stop()
