"""`quire version`: the version, the interpreter and the hot path in use (docs/cli.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from protocol import native

TREE = Path(__file__).resolve().parents[2]


def _version(*args: str, **env: str) -> list[str]:
    environ = {k: v for k, v in os.environ.items() if k != native.ENV_PURE}
    environ["PYTHONPATH"] = str(TREE) + os.pathsep + environ.get("PYTHONPATH", "")
    environ.update(env)
    out = subprocess.run([sys.executable, "-m", "tools.cli.main", "version", *args], env=environ,
                         cwd=TREE, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         timeout=120, check=True)
    return out.stdout.splitlines()


def test_version_names_the_pure_hot_path_and_why() -> None:
    lines = _version("--modules", QUIRE_PURE_PYTHON="1")
    assert lines[0].startswith("quire ")
    assert lines[1].startswith("python 3.")
    assert lines[2] == "hot path: pure Python (QUIRE_PURE_PYTHON=1)"
    assert [line.strip() for line in lines[3:]] == list(native.MODULES)


def test_version_names_a_stale_or_missing_build(tmp_path: Path) -> None:
    # An empty build directory: no manifest, so the pure modules run, saying so.
    lines = _version(QUIRE_NATIVE_DIR=str(tmp_path))
    assert lines[2] == f"hot path: pure Python (not built: no {tmp_path / native.MANIFEST} (make compiled))"
