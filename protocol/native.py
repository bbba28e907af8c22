"""Which implementation of the hot path this process runs: mypyc-compiled or pure Python.

`make compiled` (a step of `make install`; tools/native_build.py) compiles the modules of
`MODULES` with mypyc into `build/native/<ext tag>/` beside the tree, with a manifest that
records each source's SHA-256. The sources stay the Python they are: every module is
importable and correct uncompiled. `select()` runs once, when `protocol` is first
imported (every process imports it before any of these modules: `coordinator/__init__`
and `quire/client/__init__` import it first), and picks the compiled modules only when

- `QUIRE_PURE_PYTHON` is not set to 1/true/yes;
- the build exists for this interpreter (its extension suffix) and finished (a build
  that failed, or a missing C compiler, leaves no manifest);
- every compiled source is byte-for-byte the source that was compiled (a stale build
  never shadows a newer .py: one changed source and the whole set runs pure, since
  compiled modules call each other's compiled code directly);
- none of them was imported before the choice.

Otherwise every module of the set runs from its .py. The compiled modules are loaded by a
meta-path finder from the build directory, so nothing compiled ever sits beside a .py
(the editable install other checkouts share never sees it). `HOT_PATH` says which one
runs and why (`quire version`, the coordinator's start-up log line).
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import sysconfig
from pathlib import Path
from types import ModuleType
from typing import Mapping, NamedTuple, Sequence

ENV_PURE = "QUIRE_PURE_PYTHON"
GROUP = "quire_native"
"""mypyc's group name: the modules share one library, `quire_native__mypyc`."""

MODULES: tuple[str, ...] = (
    "protocol.wire",
    "protocol.frame_protocol",
    "protocol.stream",
    "protocol.mux",
    "coordinator.append_lane",
    "coordinator.append_api",
    "coordinator.spool",
    "coordinator.spool_files",
    "coordinator.pipeline",
    "coordinator.replicate_mux",
    "coordinator.replicate_api",
    "quire.client.client",
    "quire.client.connection",
    "quire.client.routes",
)
"""The compiled set, chosen by profile (docs/compiled.md)."""

ROOT = Path(__file__).resolve().parents[1]
"""The tree the sources are in (the build lives in its build/native/)."""


class HotPath(NamedTuple):
    compiled: bool
    reason: str
    """Why the pure modules run; the compiler when compiled."""
    directory: Path | None

    def describe(self) -> str:
        if self.compiled:
            return f"compiled ({self.reason}, {len(MODULES)} modules from {self.directory})"
        return f"pure Python ({self.reason})"


def ext_tag() -> str:
    """This interpreter's extension tag, e.g. `cpython-311-x86_64-linux-gnu`."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return suffix.removesuffix(".so").strip(".") or sys.implementation.cache_tag


ENV_DIR = "QUIRE_NATIVE_DIR"
"""Another build directory (the A/B of docs/compiled.md loads a Cython build from one)."""


def build_dir(root: Path = ROOT) -> Path:
    override = os.environ.get(ENV_DIR)
    return Path(override) if override else root / "build" / "native" / ext_tag()


MANIFEST = "manifest.json"


def source_path(module: str, root: Path = ROOT) -> Path:
    return root.joinpath(*module.split(".")).with_suffix(".py")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def pure_requested(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get(ENV_PURE, "").strip().lower() in ("1", "true", "yes")


def check_build(directory: Path, root: Path = ROOT) -> tuple[dict[str, Path], str]:
    """({module: .so} to load, its compiler) when the build in `directory` is complete and
    current; ({}, why not) otherwise."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except FileNotFoundError:
        return {}, f"not built: no {directory / MANIFEST} (make compiled)"
    except (OSError, ValueError) as exc:
        return {}, f"unreadable build manifest {directory / MANIFEST}: {exc}"
    built = manifest.get("modules", {})
    if sorted(built) != sorted(MODULES):
        return {}, f"the build in {directory} compiled another module set (make compiled)"
    paths: dict[str, Path] = {}
    for module, entry in built.items():
        source = source_path(module, root)
        try:
            current = digest(source)
        except OSError as exc:
            return {}, f"cannot read {source}: {exc}"
        if current != entry.get("sha256"):
            return {}, f"stale build: {source.relative_to(root)} changed since it was compiled (make compiled)"
        so = directory / entry["so"]
        if not so.is_file():
            return {}, f"incomplete build: {so} is missing (make compiled)"
        paths[module] = so
    if manifest.get("group_lib"):  # mypyc's shared library (a Cython build has none)
        group = directory / manifest["group_lib"]
        if not group.is_file():
            return {}, f"incomplete build: the group library {group} is missing (make compiled)"
        paths[f"{GROUP}__mypyc"] = group
    return paths, manifest.get("compiler", "mypyc")


class _CompiledFinder(importlib.abc.MetaPathFinder):
    """Loads the modules of the compiled set (and their shared library) from the build."""

    def __init__(self, paths: dict[str, Path]) -> None:
        self.paths = paths

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        so = self.paths.get(fullname)
        if so is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(so))
        return importlib.util.spec_from_file_location(fullname, so, loader=loader)


def select() -> HotPath:
    """Choose once per process; installs the finder when the compiled set is chosen."""
    for finder in sys.meta_path:
        if isinstance(finder, _CompiledFinder):
            return HotPath(True, "mypyc", build_dir())
    if pure_requested():
        return HotPath(False, f"{ENV_PURE}=1", None)
    directory = build_dir()
    paths, why = check_build(directory)
    if not paths:
        return HotPath(False, why, None)
    compiler = why
    early = [m for m in MODULES if m in sys.modules]
    if early:
        return HotPath(False, f"{', '.join(early)} imported before the choice", None)
    sys.meta_path.insert(0, _CompiledFinder(paths))
    return HotPath(True, compiler, directory)


def loaded() -> dict[str, bool]:
    """{module: compiled?} for the modules of the set imported so far."""
    return {m: not str(getattr(sys.modules[m], "__file__", "")).endswith(".py")
            for m in MODULES if m in sys.modules}


HOT_PATH = select()
