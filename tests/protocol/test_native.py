"""The hot path's compiled/pure choice (protocol/native.py, docs/compiled.md).

A fresh interpreter per case (the choice is made once per process, at `import protocol`):
with `QUIRE_PURE_PYTHON=1` every module of the set is its .py; with a current build
every one is its compiled extension. `make test` sets QUIRE_EXPECT_COMPILED=1 (it runs
after `make install` built them), so a build that silently failed fails here; run by
hand without a build, the compiled case is skipped, saying why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from protocol import native

TREE = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
import protocol.native as n
import coordinator  # its package imports protocol.native first, as every process does
import importlib
for m in n.MODULES:
    importlib.import_module(m)
print(json.dumps({"compiled": n.HOT_PATH.compiled, "reason": n.HOT_PATH.reason,
                  "describe": n.HOT_PATH.describe(),
                  "files": {m: sys.modules[m].__file__ for m in n.MODULES}}))
"""


def _probe(**env: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if k != native.ENV_PURE}
    environ["PYTHONPATH"] = str(TREE) + os.pathsep + environ.get("PYTHONPATH", "")
    environ.update(env)
    out = subprocess.run([sys.executable, "-c", PROBE], env=environ, cwd=TREE, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_pure_python_requested_loads_every_source() -> None:
    got = _probe(QUIRE_PURE_PYTHON="1")
    assert got["compiled"] is False
    assert got["describe"] == "pure Python (QUIRE_PURE_PYTHON=1)"
    for module, path in got["files"].items():
        assert path == str(native.source_path(module, TREE)), module


def test_a_current_build_loads_every_compiled_module() -> None:
    paths, why = native.check_build(native.build_dir(TREE), TREE)
    if not paths:
        if os.environ.get("QUIRE_EXPECT_COMPILED") == "1":
            pytest.fail(f"QUIRE_EXPECT_COMPILED=1 but the compiled hot path is not usable: {why}")
        pytest.skip(f"the hot path is not compiled here ({why})")
    got = _probe()
    assert got["compiled"] is True, got["reason"]
    for module, path in got["files"].items():
        assert path == str(paths[module]), module
        assert path.endswith(".so")


def _fake_tree(tmp_path: Path) -> tuple[Path, Path]:
    """A root with the set's sources and a build directory whose manifest matches them."""
    root, build = tmp_path / "tree", tmp_path / "tree" / "build"
    modules = {}
    for module in native.MODULES:
        src = native.source_path(module, root)
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_text(f"# {module}\n")
        so = Path(*module.split(".")).with_suffix(".so")
        (build / so).parent.mkdir(parents=True, exist_ok=True)
        (build / so).write_bytes(b"")
        modules[module] = {"so": str(so), "sha256": native.digest(src)}
    (build / "group.so").write_bytes(b"")
    (build / native.MANIFEST).write_text(json.dumps({"modules": modules, "group_lib": "group.so"}))
    return root, build


def test_a_current_manifest_names_each_extension(tmp_path: Path) -> None:
    root, build = _fake_tree(tmp_path)
    paths, compiler = native.check_build(build, root)
    assert compiler == "mypyc"
    assert paths[f"{native.GROUP}__mypyc"] == build / "group.so"
    assert paths["protocol.wire"] == build / "protocol" / "wire.so"


def test_a_cython_build_has_no_group_library(tmp_path: Path) -> None:
    root, build = _fake_tree(tmp_path)
    manifest = json.loads((build / native.MANIFEST).read_text())
    manifest.update(group_lib="", compiler="cython")
    (build / native.MANIFEST).write_text(json.dumps(manifest))
    paths, compiler = native.check_build(build, root)
    assert compiler == "cython"
    assert sorted(paths) == sorted(native.MODULES)


def test_a_changed_source_makes_the_whole_build_stale(tmp_path: Path) -> None:
    root, build = _fake_tree(tmp_path)
    native.source_path("coordinator.spool", root).write_text("# edited after the build\n")
    paths, why = native.check_build(build, root)
    assert paths == {}
    assert why.startswith("stale build: coordinator/spool.py changed since it was compiled")


def test_no_manifest_another_set_or_a_missing_library_is_not_a_build(tmp_path: Path) -> None:
    root, build = _fake_tree(tmp_path)
    (build / "protocol" / "wire.so").unlink()
    assert native.check_build(build, root)[1].startswith("incomplete build:")
    manifest = json.loads((build / native.MANIFEST).read_text())
    del manifest["modules"]["protocol.wire"]
    (build / native.MANIFEST).write_text(json.dumps(manifest))
    assert "another module set" in native.check_build(build, root)[1]
    (build / native.MANIFEST).unlink()
    assert native.check_build(build, root)[1].startswith("not built:")


@pytest.mark.parametrize("value,pure", [("1", True), ("yes", True), ("TRUE", True),
                                        ("0", False), ("", False)])
def test_pure_requested_reads_the_environment(value: str, pure: bool) -> None:
    assert native.pure_requested({native.ENV_PURE: value}) is pure


def test_compiled_modules_raise_with_a_cause_only_through_caused() -> None:
    """mypyc drops the cause of `raise A from B` (`__cause__` stays None: measured with
    mypy 2.4), and the CLI names the TLS variable to set by the Unavailable's cause (a
    TLSRefused). In a compiled module a cause is set with protocol.errors.caused;
    `from None` only hides the context from a traceback and may stay."""
    import ast

    offenders = []
    for module in native.MODULES:
        path = native.ROOT / (module.replace(".", "/") + ".py")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Raise) and node.cause is not None \
                    and not (isinstance(node.cause, ast.Constant) and node.cause.value is None):
                offenders.append(f"{path.relative_to(native.ROOT)}:{node.lineno}")
    assert not offenders, f"`raise ... from X` in compiled modules (use caused()): {offenders}"


def test_caused_sets_the_cause_in_compiled_code_too() -> None:
    from protocol.errors import Unavailable, caused
    from protocol.tls import TLSRefused

    refused = TLSRefused("TLS handshake refused")
    err = caused(Unavailable("hello failed"), refused)
    assert err.__cause__ is refused and err.__suppress_context__
