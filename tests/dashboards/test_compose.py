"""compose/ cannot run here (no Docker engine), so it is kept honest by reading it: every
flag a quire, Celery, Flower, Spark or etcd command is given must appear in that
program's own `--help`, every QUIRE_* variable must be a real setting, and the topology
must be the one compose/README.md promises."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from protocol import ProcessId

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "compose" / "docker-compose.yml"
VENV_BIN = Path(sys.executable).parent


@functools.cache
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def services() -> dict[str, dict[str, Any]]:
    return compose()["services"]


def commands(program: str) -> list[tuple[str, list[str]]]:
    return [(name, [str(t) for t in svc["command"]]) for name, svc in services().items()
            if isinstance(svc.get("command"), list) and str(svc["command"][0]) == program]


@functools.cache
def help_text(*argv: str) -> str:
    env = {**os.environ, "COLUMNS": "250", "TERM": "dumb", "NO_COLOR": "1",
           "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(list(argv), capture_output=True, env=env, timeout=120,
                          stdin=subprocess.DEVNULL)
    return proc.stdout.decode(errors="replace") + proc.stderr.decode(errors="replace")


def flags(tokens: list[str]) -> list[str]:
    """The option names among `tokens` (`--a=b` -> `--a`)."""
    return [t.split("=", 1)[0] for t in tokens if re.fullmatch(r"--?[A-Za-z][\w-]*(=.*)?", t)]


def documented(flag: str, text: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text) is not None


def leading_words(tokens: list[str]) -> list[str]:
    out = []
    for t in tokens:
        if t.startswith("-"):
            break
        out.append(t)
    return out


# -- quire commands ------------------------------------------------------------------------

def test_quire_commands_use_only_real_flags() -> None:
    seen = set()
    for name, cmd in commands("quire"):
        words = leading_words(cmd[1:])
        text = help_text(sys.executable, "-m", "tools.cli.main", *words, "--help")
        assert "Usage:" in text, f"{name}: `quire {' '.join(words)} --help` failed:\n{text}"
        for flag in flags(cmd[1:]):
            assert documented(flag, text), f"{name}: quire {' '.join(words)} has no {flag}\n{text}"
        seen.add(words[0])
    assert {"coordinator", "dashboard", "spark"} <= seen


def test_celery_commands_use_only_real_flags() -> None:
    kinds = Counter()
    for name, cmd in commands("celery"):
        assert cmd[1:3] == ["-A", "workers.app"], f"{name}: expected `celery -A workers.app …`"
        sub, rest = cmd[3], cmd[4:]
        kinds[sub] += 1
        if sub == "flower":
            import flower.options  # noqa: F401 - defines Flower's tornado options
            from tornado.options import options

            known = {"--" + n.replace("_", "-") for n in options._options}
            for flag in flags(rest):
                assert flag.replace("_", "-") in known, f"{name}: flower has no {flag}"
            continue
        text = help_text(str(VENV_BIN / "celery"), "-A", "workers.app", sub, "--help")
        assert "Usage:" in text, text
        for flag in flags(rest):
            assert documented(flag, text), f"{name}: celery {sub} has no {flag}\n{text}"
    assert kinds["beat"] == 1, "exactly one beat per cluster"
    assert kinds["flower"] == 1 and kinds["worker"] >= 3


@pytest.mark.skipif(shutil.which("java") is None, reason="no JVM")
def test_spark_commands_use_only_real_flags() -> None:
    mains = set()
    for name, cmd in commands("spark-class"):
        text = help_text(str(VENV_BIN / "spark-class"), cmd[1], "--help")
        assert "Usage:" in text, text
        for flag in flags(cmd[2:]):
            assert documented(flag, text), f"{name}: {cmd[1]} has no {flag}\n{text}"
        mains.add(cmd[1].rsplit(".", 1)[-1])
    assert mains == {"Master", "Worker"}


@pytest.mark.skipif(shutil.which("etcd") is None, reason="no etcd binary")
def test_etcd_members_use_only_real_settings() -> None:
    text = help_text("etcd", "--help")
    members = {n: s for n, s in services().items() if str(s.get("image", "")).startswith("quay.io/coreos/etcd")}
    assert len(members) == 3
    cluster = set()
    for name, svc in members.items():
        env = svc["environment"]
        for var in env:
            flag = "--" + var.removeprefix("ETCD_").lower().replace("_", "-")
            assert documented(flag, text), f"{name}: etcd has no {flag} (from {var})"
        assert env["ETCD_NAME"] == name
        assert env["ETCD_ADVERTISE_CLIENT_URLS"] == f"http://{name}:2379"
        cluster.add(env["ETCD_INITIAL_CLUSTER"])
    assert cluster == {",".join(f"{n}=http://{n}:2380" for n in sorted(members))}


# -- environment and topology --------------------------------------------------------------

def test_quire_environment_variables_are_real_settings() -> None:
    from protocol.config import _PARSERS
    from workers.config import _FIELDS, _TEXT_FIELDS

    known = {"QUIRE_" + k.upper() for k in _PARSERS} | {v[0] for v in _FIELDS.values()} | set(_TEXT_FIELDS.values()) | {"QUIRE_CONFIG"}
    for name, svc in services().items():
        for var in svc.get("environment") or {}:
            if var.startswith("QUIRE_"):
                assert var in known, f"{name}: {var} is not a quire setting"


def test_coordinators_span_zones_and_advertise_their_own_name() -> None:
    coords = {n: cmd for n, cmd in commands("quire") if cmd[1] == "coordinator"}
    assert len(coords) == 3
    zones, ids = set(), set()
    for name, cmd in coords.items():
        opts = dict(zip(cmd[2::2], cmd[3::2], strict=True))
        host = opts["--listen"].rsplit(":", 1)[0]
        assert host == name == services()[name].get("hostname", name)
        # Every etcd member, so losing the one a coordinator talks to is invisible (#31).
        members = [u.removeprefix("http://").split(":")[0] for u in opts["--etcd"].split(",")]
        assert len(members) == 3 and all(m in services() for m in members)
        assert "--metrics-port" in opts and "--redis" in opts
        # Prometheus runs in another container: metrics bind beyond loopback, no relay.
        assert opts["--metrics-addr"] == "0.0.0.0"
        ProcessId(opts["--zone"], opts["--id"]).validate()  # what the coordinator will check
        zones.add(opts["--zone"])
        ids.add((opts["--zone"], opts["--id"]))
    assert len(zones) >= 2 and len(ids) == 3


def test_a_worker_pool_per_queue() -> None:
    queues = []
    for _, cmd in commands("celery"):
        if cmd[3] == "worker":
            queues += cmd[cmd.index("-Q") + 1].split(",")
    assert sorted(queues) == sorted(set(queues)), "a queue served by two pools"
    assert {"persist", "index", "pulse", "celery"} <= set(queues)


def test_depends_on_and_volumes_refer_to_defined_things() -> None:
    names = set(services())
    volumes = set(compose()["volumes"])
    for name, svc in services().items():
        deps = svc.get("depends_on") or {}
        assert set(deps) <= names, f"{name} depends on {set(deps) - names}"
        for v in svc.get("volumes") or []:
            src = v.split(":", 1)[0]
            if src.startswith("."):
                assert (COMPOSE.parent / src).resolve().exists(), f"{name}: {src} missing"
            else:
                assert src in volumes, f"{name}: volume {src} not declared"
        mode = svc.get("network_mode", "")
        if mode.startswith("service:"):
            assert mode.removeprefix("service:") in names


def test_no_metrics_relay_sidecars() -> None:
    for name, svc in services().items():
        assert not str(svc.get("image", "")).startswith("alpine/socat"), name
        assert not str(svc.get("network_mode", "")).startswith("service:coordinator"), name


def test_every_service_role_is_present() -> None:
    images = Counter(str(s.get("image", "")).split(":")[0] for s in services().values())
    for image in ("minio/minio", "minio/mc", "redis", "prom/prometheus", "grafana/grafana"):
        assert images[image] >= 1, image
    mains = {cmd[1] for _, cmd in commands("spark-class")}
    assert any(m.endswith("Master") for m in mains) and any(m.endswith("Worker") for m in mains)


def test_dockerfile_copies_every_package() -> None:
    import tomllib

    dockerfile = (REPO / "compose" / "Dockerfile").read_text()
    assert dockerfile.startswith("# syntax=docker/dockerfile:1")
    assert "FROM python:3.11-slim" in dockerfile
    include = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    copied = set(re.findall(r"^COPY (\w+) \./\1$", dockerfile, re.M))
    assert {p.rstrip("*") for p in include} <= copied
    for package in copied:
        assert (REPO / package / "__init__.py").exists(), package
