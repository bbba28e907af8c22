"""compose/secure.yml read without Docker (compose/secure_smoke.py runs it for real in
`make compose-test`): its flags and settings are real, no secret is written in it, and
every file it points a container at is one tools/compose_secrets.py makes, 0600 when
private, in the directory mounted into that container."""

from __future__ import annotations

import re
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from .test_compose import REPO, documented, flags, help_text, leading_words

pytestmark = pytest.mark.timeout(240)

SECURE = REPO / "compose" / "secure.yml"
MOUNT = "/run/quire/secrets"


class _ComposeLoader(yaml.SafeLoader):
    """Compose's `!override` / `!reset` tags: the value underneath."""


def _tagged(loader: yaml.SafeLoader, _suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    return loader.construct_scalar(node)


_ComposeLoader.add_multi_constructor("!", _tagged)


def secure() -> dict[str, dict[str, Any]]:
    return yaml.load(SECURE.read_text(), Loader=_ComposeLoader)["services"]  # noqa: S506 - SafeLoader subclass


def test_quire_commands_and_settings_are_real() -> None:
    from protocol.config import _PARSERS
    from workers.config import _FIELDS, _TEXT_FIELDS

    known = ({"QUIRE_" + k.upper() for k in _PARSERS} | {v[0] for v in _FIELDS.values()}
             | set(_TEXT_FIELDS.values()))
    seen = set()
    for name, svc in secure().items():
        cmd = [str(t) for t in svc.get("command") or []]
        if cmd[:1] == ["quire"]:
            words = leading_words(cmd[1:])
            text = help_text(sys.executable, "-m", "tools.cli.main", *words, "--help")
            for flag in flags(cmd[1:]):
                assert documented(flag, text), f"{name}: quire {' '.join(words)} has no {flag}"
            seen.add(words[0])
        for var in svc.get("environment") or {}:
            if var.startswith("QUIRE_"):
                assert var in known, f"{name}: {var} is not a quire setting"
    assert {"coordinator", "consumer", "dashboard"} <= seen


def test_coordinators_and_etcd_are_secured() -> None:
    services = secure()
    for name in ("coordinator-a1", "coordinator-a2", "coordinator-b1"):
        cmd = [str(t) for t in services[name]["command"]]
        opts = dict(zip(cmd[2::2], cmd[3::2]))
        assert "--tls-client-auth" in cmd and opts["--auth-keys-file"] == f"{MOUNT}/auth.keys"
        assert all(u.startswith("https://") for u in opts["--etcd"].split(","))
        assert opts["--redis"].startswith("rediss://quire-coordinator:${")
    for name in ("etcd-1", "etcd-2", "etcd-3"):
        env = services[name]["environment"]
        assert env["ETCD_CLIENT_CERT_AUTH"] == env["ETCD_PEER_CLIENT_CERT_AUTH"] == "true"
        assert all(v.startswith("https://") or "=https://" in v
                   for k, v in env.items() if k.endswith("_URLS") or k == "ETCD_INITIAL_CLUSTER")
    redis = [str(t) for t in services["redis"]["command"]]
    assert redis[redis.index("--port") + 1] == "0" and "--aclfile" in redis


@pytest.mark.skipif(not Path("/usr/bin/etcd").exists(), reason="no etcd binary")
def test_etcd_settings_are_real() -> None:
    text = help_text("etcd", "--help")
    for name in ("etcd-1", "etcd-2", "etcd-3"):
        for var in secure()[name]["environment"]:
            flag = "--" + var.removeprefix("ETCD_").lower().replace("_", "-")
            assert documented(flag, text), f"{name}: etcd has no {flag} (from {var})"


def test_no_secret_is_written_in_the_files() -> None:
    """Every password, key or token comes from a `${VAR:?message}` (no default) or a
    mounted file; the committed files hold none."""
    for path in (SECURE, REPO / "compose" / "ci-secure.yml"):
        text = path.read_text()
        for m in re.finditer(r"\$\{(\w+)([^}]*)\}", text):
            var, rest = m.groups()
            assert rest.startswith(":?"), f"{path.name}: ${{{var}}} has a default or none required"
        for m in re.finditer(r"^\s*(\w*(?:PASSWORD|SECRET|TOKEN|KEY)\w*):\s+(\S+)", text, re.M):
            value = m.group(2)
            assert value.startswith(("${", "/run/quire/secrets/")), f"{path.name}: {m.group(0)}"
        for m in re.finditer(r"rediss?://[^:@/]+:([^@]+)@", text):
            assert m.group(1).startswith("${"), f"{path.name}: a password in {m.group(0)}"
        assert "BEGIN" not in text and "PRIVATE KEY" not in text


def test_every_mounted_file_is_made(tmp_path: Path) -> None:
    import os

    from tools.compose_secrets import make

    env_file = make(tmp_path / "secrets", owner=os.geteuid())
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    text = SECURE.read_text()
    for var in set(re.findall(r"\$\{(\w+):\?", text)):
        assert env.get(var), f"secure.env lacks {var}"
    for name, svc in secure().items():
        mounts = [v for v in svc.get("volumes") or [] if v.endswith(f":{MOUNT}:ro")]
        body = yaml.safe_dump({k: v for k, v in svc.items() if k != "volumes"})
        used = set(re.findall(rf"{MOUNT}/([\w.-]+)", body))
        if not used:
            continue
        assert len(mounts) == 1, f"{name} uses {sorted(used)} but mounts no secrets"
        sub = mounts[0].split("}/", 1)[1].split(":", 1)[0]
        directory = tmp_path / "secrets" / sub
        for f in used:
            path = directory / f
            assert path.is_file(), f"{name}: {MOUNT}/{f} is not made in {sub}/"
            private = not f.endswith(".pem") or f.endswith("-key.pem")
            if private:
                assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    # the CA's key is never in a mounted directory
    assert not list((tmp_path / "secrets").glob("[!c]*/ca-key.pem"))
