"""Issue #37: a second terminal finds the local cluster `quire up` runs, and a service
that cannot be reached fails fast, in one line naming it, the URL and what sets it.

One real `quire up` (etcd, Redis, a coordinator, worker, beat, dashboard) runs in the
*default* data dir of a fake HOME, so "nothing set" and "only QUIRE_DATA_DIR" are both
the real thing: commands run as subprocesses with an environment of PATH and HOME
alone (plus QUIRE_DATA_DIR where said), as a fresh shell would have.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from protocol.discovery import ENV_FILE, format_env, read_env_file
from tools.services import QuireUpService, RedisService, Service, free_port

pytestmark = pytest.mark.timeout(300)

QUIRE = str(Path(sys.executable).with_name("quire"))
FAIL_FAST = 5.0
"""Seconds an unreachable service may cost a command (issue #37), measured in-process
so interpreter start-up on a loaded machine does not count."""


class Cluster:
    def __init__(self, home: Path, up: QuireUpService) -> None:
        self.home = home
        self.up = up
        self.data_dir = up.data_dir
        self.vars = up.variables

    def env(self, *, data_dir: bool, **extra: str) -> dict[str, str]:
        """A fresh shell's environment: PATH and HOME, QUIRE_DATA_DIR if asked."""
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.home),
               "LANG": "C.UTF-8", **extra}
        if data_dir:
            env["QUIRE_DATA_DIR"] = str(self.data_dir)
        return env

    def quire(self, *args: str, data_dir: bool = True, stdin: bytes | None = None,
              cwd: Path | None = None, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([QUIRE, *args], input=stdin.decode() if stdin else None,
                              capture_output=True, text=True, timeout=120, check=False,
                              env=self.env(data_dir=data_dir, **extra), cwd=cwd)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("home")
    data = home / ".local" / "share" / "quire"  # the default data dir of this HOME
    env = {"HOME": str(home), "QUIRE_DATA_DIR": "", "XDG_DATA_HOME": ""}
    with QuireUpService(data, "--no-restart", env=env) as up:
        yield Cluster(home, up)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr[-2000:]}"
    return result.stdout


def one_line(result: subprocess.CompletedProcess[str] | str) -> str:
    text = result if isinstance(result, str) else result.stderr
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line, got:\n{text}"
    assert "Traceback" not in text
    return lines[0]


def test_env_file_holds_every_address_and_quire_env_prints_it(cluster: Cluster) -> None:
    v = cluster.vars
    assert set(v) >= {"QUIRE_BROKER", "QUIRE_ETCD_URL", "QUIRE_ETCD_ROOT", "QUIRE_REDIS_URL",
                      "QUIRE_STORE_URL", "QUIRE_DATA_DIR"}
    assert v["QUIRE_BROKER"] == f"127.0.0.1:{cluster.up.port}"
    assert (cluster.data_dir / ENV_FILE).stat().st_mode & 0o077 == 0  # may hold a token
    # eval "$(quire env)" in a shell with nothing set (the default data dir)
    script = f'eval "$({QUIRE} env)" && echo "$QUIRE_ETCD_URL $QUIRE_REDIS_URL $QUIRE_BROKER"'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                         env=cluster.env(data_dir=False), check=False)
    assert out.stdout.split() == [v["QUIRE_ETCD_URL"], v["QUIRE_REDIS_URL"], v["QUIRE_BROKER"]], out.stderr


def test_must_show_commands_need_only_the_data_dir(cluster: Cluster, tmp_path: Path) -> None:
    specs = tmp_path / "specs.yaml"
    specs.write_text(f"name: second/terminal/\nreplication: 1\nfragment:\n"
                     f"  stores: [{cluster.vars['QUIRE_STORE_URL']}]\n"
                     f"children:\n  - name: second/terminal/part-000\n")
    ok(cluster.quire("journals", "apply", "-f", str(specs)))
    ok(cluster.quire("append", "-j", "second/terminal/part-000", stdin=b'{"n": 1}\n'))

    assert "would remove" in ok(cluster.quire("journals", "prune", "--dry-run"))
    assert "revision" in ok(cluster.quire("shards", "list"))
    listing = ok(cluster.quire("fragments", "list", "-j", "second/terminal/part-000"))
    assert "second/terminal/part-000: 1 fragments" in listing

    ready = "ready a#demo1"
    consumer = Service("consumer-demo1", [QUIRE, "consumer", "run",
                                          "consumers.examples.counts:Counts", "--zone", "a",
                                          "--id", "demo1", "--data-dir", str(tmp_path / "c")],
                       env={**cluster.env(data_dir=True), "QUIRE_DISCOVER": ""},
                       workdir=tmp_path / "consumer", ready_timeout=90,
                       probe=lambda: ready in consumer.log_path.read_text())
    consumer.start()  # waits for "ready": etcd found, member announced under its lease
    code = consumer.stop()  # SIGTERM: commit, release, revoke; exit 0
    assert code == 0, consumer.log_path.read_text()[-2000:]


def test_nothing_set_finds_the_default_data_dir(cluster: Cluster) -> None:
    assert "revision" in ok(cluster.quire("shards", "list", data_dir=False))
    assert "would remove" in ok(cluster.quire("journals", "prune", "--dry-run", data_dir=False))
    assert ok(cluster.quire("config", "print", "-o", "json", data_dir=False)).count(
        cluster.vars["QUIRE_ETCD_URL"]) == 1


def test_explicit_settings_win_over_the_discovered_cluster(cluster: Cluster) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    result = cluster.quire("shards", "list", QUIRE_ETCD_URL=closed)
    assert result.returncode == 6
    assert closed in one_line(result)


def test_redis_stopped_prune_fails_fast_naming_redis(cluster: Cluster, tmp_path: Path) -> None:
    """The must-show, as a user sees it: a fresh shell, Redis stopped."""
    redis = RedisService("redis-stopped", workdir=tmp_path / "redis")
    with redis:
        url = f"redis://127.0.0.1:{redis.port}/0"
    started = time.monotonic()
    result = cluster.quire("journals", "prune", QUIRE_REDIS_URL=url)
    elapsed = time.monotonic() - started
    assert result.returncode == 6
    line = one_line(result)
    assert "Redis" in line and url in line and "QUIRE_REDIS_URL" in line, line
    # Interpreter start-up included; the wait itself is bounded in the in-process test.
    assert elapsed < 30, elapsed


# -- fail fast, in-process (so the bound measures the command, not Python's start) -------

def run_cli(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], *args: str) -> tuple[int, str, float]:
    import tools.cli.common as common
    from tools.cli.main import main

    for key in [k for k in os.environ if k.startswith("QUIRE_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    common._settings.clear()
    err, out = io.StringIO(), io.StringIO()
    started = time.monotonic()
    with redirect_stderr(err), redirect_stdout(out):
        code = main(list(args))
    elapsed = time.monotonic() - started
    common._settings.clear()
    return code, err.getvalue() + out.getvalue(), elapsed


@pytest.fixture
def closed_port() -> int:
    return free_port()  # handed out once and never bound: connections are refused


def test_etcd_unreachable_fails_fast(monkeypatch: pytest.MonkeyPatch, closed_port: int) -> None:
    url = f"http://127.0.0.1:{closed_port}"
    code, text, elapsed = run_cli(monkeypatch, {"QUIRE_ETCD_URL": url, "QUIRE_DISCOVER": "0"},
                                  "shards", "list")
    line = one_line(text)
    assert code == 6 and "etcd" in line and url in line and "QUIRE_ETCD_URL" in line, line
    assert elapsed < FAIL_FAST, elapsed


def test_redis_unreachable_fails_fast(monkeypatch: pytest.MonkeyPatch, cluster: Cluster,
                                      closed_port: int) -> None:
    url = f"redis://127.0.0.1:{closed_port}/0"
    code, text, elapsed = run_cli(monkeypatch, {"QUIRE_DATA_DIR": str(cluster.data_dir),
                                                "QUIRE_REDIS_URL": url}, "journals", "prune")
    line = one_line(text)
    assert code == 6 and "Redis" in line and url in line and "QUIRE_REDIS_URL" in line, line
    assert elapsed < FAIL_FAST, elapsed


def test_coordinators_unreachable_fail_fast(monkeypatch: pytest.MonkeyPatch, closed_port: int) -> None:
    endpoint = f"127.0.0.1:{closed_port}"
    code, text, elapsed = run_cli(monkeypatch, {"QUIRE_BROKER": endpoint, "QUIRE_DISCOVER": "0"},
                                  "journals", "list")
    line = one_line(text)
    assert code == 6 and "coordinator" in line and endpoint in line and "QUIRE_BROKER" in line, line
    assert elapsed < FAIL_FAST, elapsed


def test_store_unreachable_fails_fast(monkeypatch: pytest.MonkeyPatch, closed_port: int) -> None:
    import spark.main  # noqa: F401
    from fragment_store.errors import StoreUnavailable
    from spark.dask_reader import fragment_index

    endpoint = f"127.0.0.1:{closed_port}"
    # A first call loads pandas, dask and the S3 client (seconds on a loaded machine):
    # the bound below is the waiting on the store, not imports.
    for key, value in (("QUIRE_S3_ENDPOINT", f"http://{endpoint}"), ("QUIRE_S3_ACCESS_KEY", "k"),
                       ("QUIRE_S3_SECRET_KEY", "s")):
        monkeypatch.setenv(key, value)
    with pytest.raises(StoreUnavailable):
        fragment_index("s3://quire-unreachable/", selector="topic=x")
    code, text, elapsed = run_cli(monkeypatch, {
        "QUIRE_DISCOVER": "0", "QUIRE_STORE_URL": "s3://quire-unreachable/",
        "QUIRE_S3_ENDPOINT": f"http://{endpoint}", "QUIRE_S3_ACCESS_KEY": "k",
        "QUIRE_S3_SECRET_KEY": "s"}, "spark", "index", "-l", "topic=x")
    line = one_line(text)
    assert code != 0 and "store" in line and "s3://quire-unreachable/" in line, line
    assert endpoint in line and "QUIRE_STORE_URL" in line and "QUIRE_S3_ENDPOINT" in line, line
    assert elapsed < FAIL_FAST, elapsed


# -- the env file's life, and quire up's members' security ---------------------------------

def test_quire_env_refuses_a_dead_cluster(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / ENV_FILE).write_text(format_env({"QUIRE_BROKER": "127.0.0.1:1"}, dead.pid, tmp_path))
    result = subprocess.run([QUIRE, "env", "--data-dir", str(tmp_path)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 6
    assert f"pid {dead.pid}" in one_line(result) and "is gone" in result.stderr


def test_discovery_skips_a_dead_cluster_and_explicit_groups(tmp_path: Path) -> None:
    from protocol.discovery import discover

    (tmp_path / ENV_FILE).write_text(format_env(
        {"QUIRE_BROKER": "127.0.0.1:9", "QUIRE_TLS_CA": "/ca.pem", "QUIRE_TLS_CERT": "/c.pem",
         "QUIRE_TOKEN": "t0ken"}, os.getpid(), tmp_path))
    base = {"QUIRE_DATA_DIR": str(tmp_path), "HOME": str(tmp_path)}
    assert discover(base) == {"QUIRE_BROKER": "127.0.0.1:9", "QUIRE_TLS_CA": "/ca.pem",
                              "QUIRE_TLS_CERT": "/c.pem", "QUIRE_TOKEN": "t0ken"}
    # One explicit variable of a group drops the group; explicit settings win.
    assert discover({**base, "QUIRE_TLS_CA": "/mine.pem", "QUIRE_TOKEN_FILE": "/tok"}) == {
        "QUIRE_BROKER": "127.0.0.1:9"}
    assert discover({**base, "QUIRE_DISCOVER": "0"}) == {}
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / ENV_FILE).write_text(format_env({"QUIRE_BROKER": "127.0.0.1:9"}, dead.pid, tmp_path))
    assert discover(base) == {}
    assert read_env_file(tmp_path / ENV_FILE).variables == {"QUIRE_BROKER": "127.0.0.1:9"}  # type: ignore[union-attr]


def test_quire_up_clears_inherited_security_for_members_and_says_so(tmp_path: Path) -> None:
    """The seen failure: an --auth session's exports still set, `quire up --tls` started
    coordinators that required tokens its probe did not present."""
    keys = tmp_path / "keys"
    keys.write_text("c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3JldC0xMjM0NTY3OA==\n")
    keys.chmod(0o600)
    inherited = {"QUIRE_AUTH_KEYS_FILE": str(keys), "QUIRE_TOKEN": "stale-token",
                 "QUIRE_DATA_DIR": "", "HOME": str(tmp_path)}
    up = QuireUpService(tmp_path / "data", "--no-restart", env=inherited)
    with up:
        log = up.log_path.read_text()
        assert "inherited QUIRE_AUTH_KEYS_FILE, QUIRE_TOKEN cleared for members" in log
        # Members serve without tokens: a client with none is answered.
        result = subprocess.run([QUIRE, "journals", "list"], capture_output=True, text=True,
                                timeout=60, check=False,
                                env={"PATH": os.environ["PATH"], "HOME": str(tmp_path),
                                     "QUIRE_DATA_DIR": str(up.data_dir)})
        assert result.returncode == 0, result.stderr
    assert not (up.data_dir / ENV_FILE).exists()  # gone with the cluster


def test_stop_removes_env_file_only_if_ours(tmp_path: Path) -> None:
    from tools.local_cluster import LocalCluster

    cluster = LocalCluster.__new__(LocalCluster)
    cluster.data_dir = tmp_path
    (tmp_path / ENV_FILE).write_text(format_env({}, os.getpid() + 1_000_000, tmp_path))
    cluster._remove_env_file()
    assert (tmp_path / ENV_FILE).exists()  # another quire up's: left alone
    (tmp_path / ENV_FILE).write_text(format_env({}, os.getpid(), tmp_path))
    cluster._remove_env_file()
    assert not (tmp_path / ENV_FILE).exists()
