"""`quire auth keygen` / `quire auth token` (tools/cli/auth.py)."""

from __future__ import annotations

import subprocess

from protocol.auth import Capability, Keyring, decode_keys
from tools.cli.common import exit_code_for
from protocol import Status, for_status


def _quire(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the CLI in-process (no interpreter start per call) with `env` over os.environ."""
    import contextlib
    import io
    import os
    from unittest import mock

    from tools.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with mock.patch.dict(os.environ, env or {}), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        code = main(list(args))
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def test_keygen_then_token_round_trip(tmp_path) -> None:  # noqa: ANN001
    key = _quire("auth", "keygen").stdout.strip()
    assert len(decode_keys(key)[0]) == 32
    keys = tmp_path / "keys"
    keys.write_text(key + "\n")
    keys.chmod(0o600)
    out = _quire("auth", "token", "--cap", "append,read", "--prefix", "team-a/", "--ttl", "1h",
                 "--subject", "ci", "--keys-file", str(keys))
    assert out.returncode == 0, out.stderr
    claims = Keyring(decode_keys(key)).verify(out.stdout.strip())
    assert claims.caps == Capability.APPEND | Capability.READ
    assert claims.scope.prefixes == ("team-a/",) and claims.subject == "ci"
    assert 3590 <= claims.expires_at - claims.issued_at <= 3600
    # The same from the environment, with a selector scope.
    out = _quire("auth", "token", "--cap", "read", "--selector", "team=a",
                 env={"QUIRE_AUTH_KEYS": key})
    assert out.returncode == 0, out.stderr
    assert str(Keyring(decode_keys(key)).verify(out.stdout.strip()).scope.selector) == "team=a"


def test_token_errors_are_one_line_with_exit_codes(tmp_path) -> None:  # noqa: ANN001
    out = _quire("auth", "token", "--cap", "read", "--prefix", "a/", env={"QUIRE_AUTH_KEYS": "",
                                                                        "QUIRE_AUTH_KEYS_FILE": ""})
    assert out.returncode == 7 and "no signing keys" in out.stderr
    key = _quire("auth", "keygen").stdout.strip()
    for bad in (["--cap", "root", "--prefix", "a/"], ["--cap", "read"],
                ["--cap", "read", "--prefix", "a/", "--ttl", "30d"]):
        out = _quire("auth", "token", *bad, env={"QUIRE_AUTH_KEYS": key})
        assert out.returncode == 7, (bad, out.stderr)
        assert out.stderr.startswith("error:") and key not in out.stderr


def test_refusals_exit_as_not_allowed() -> None:
    for status in (Status.UNAUTHORIZED, Status.FORBIDDEN):
        assert exit_code_for(for_status(status)("x", journal="a/b/c")) == 5


def test_verify_prints_claims_or_refuses(tmp_path) -> None:  # noqa: ANN001
    import json

    key = _quire("auth", "keygen").stdout.strip()
    env = {"QUIRE_AUTH_KEYS": key}
    tok = _quire("auth", "token", "--cap", "read,list", "--prefix", "team-a/", "--subject", "ci",
                 env=env).stdout.strip()
    out = _quire("auth", "verify", tok, env=env)
    assert out.returncode == 0, out.stderr
    claims = json.loads(out.stdout)
    assert claims["sub"] == "ci" and claims["cap"] == ["list", "read"] and claims["pfx"] == ["team-a/"]
    out = _quire("auth", "verify", env={**env, "QUIRE_TOKEN": tok})  # from the environment
    assert out.returncode == 0 and json.loads(out.stdout)["sub"] == "ci"
    other = _quire("auth", "keygen").stdout.strip()
    out = _quire("auth", "verify", tok, env={"QUIRE_AUTH_KEYS": other})
    assert out.returncode == 5 and "UNAUTHORIZED" in out.stderr and tok not in out.stderr
