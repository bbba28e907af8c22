"""Compile the hot path with mypyc: `python -m tools.native_build [--force]` (`make compiled`).

`--compiler cython --out DIR` builds the same modules with Cython instead (plain Python
semantics, annotations not used as C types), for the A/B of docs/compiled.md: load it
with QUIRE_NATIVE_DIR=DIR. Cython is not a dependency; install it to run that.

Compiles the modules of `protocol.native.MODULES` into build/native/<ext tag>/ (one shared
library, `quire_native__mypyc`, and a small extension per module) and writes the manifest
`protocol.native` checks at import: each source's SHA-256, so a build older than its
sources is never loaded. Up to date → nothing is rebuilt. The manifest is removed before
a build and written after it, so a failed build (no C compiler, a mypyc error) leaves
the pure modules in use; the exit status says it failed. `QUIRE_PURE_PYTHON=1` skips the
build. Run from the tree's root (mypyc names modules by their paths).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from protocol import native

MYPY_FLAGS = ["--follow-imports=silent", "--ignore-missing-imports", "--no-warn-unused-ignores"]
"""Only the compiled modules are checked; what they import is read for its types."""


def current(directory: Path, compiler: str) -> bool:
    paths, built_by = native.check_build(directory)
    return bool(paths) and built_by == compiler


def _cython(sources: list[str], work: Path) -> list:
    from Cython.Build import cythonize
    from setuptools import Extension

    exts = [Extension(src.removesuffix(".py").replace("/", "."), [src]) for src in sources]
    return cythonize(exts, build_dir=str(work / "c"), quiet=True,
                     compiler_directives={"language_level": 3, "annotation_typing": False,
                                          "binding": True})


def build(directory: Path, *, opt_level: str = "3", compiler: str = "mypyc") -> None:
    # Imported here: mypy and setuptools are needed to build, not to run.
    from setuptools import Distribution
    from setuptools.command.build_ext import build_ext

    work = directory.parent / f".work-{directory.name}-{compiler}"
    (directory / native.MANIFEST).unlink(missing_ok=True)
    shutil.rmtree(directory, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    sources = [str(native.source_path(m).relative_to(native.ROOT)) for m in native.MODULES]
    digests = {m: native.digest(native.source_path(m)) for m in native.MODULES}
    if compiler == "cython":
        extensions = _cython(sources, work)
    else:
        from mypyc.build import mypycify

        extensions = mypycify(sources + MYPY_FLAGS + ["--cache-dir", str(work / "mypy")],
                              opt_level=opt_level, group_name=native.GROUP,
                              target_dir=str(work / "c"))
    dist = Distribution({"name": "quire-native", "ext_modules": extensions})
    cmd = build_ext(dist)
    cmd.build_lib = str(directory)
    cmd.build_temp = str(work / "obj")
    cmd.parallel = os.cpu_count() or 1
    cmd.ensure_finalized()
    cmd.run()
    suffix = f".{native.ext_tag()}.so"
    modules = {}
    for module in native.MODULES:
        so = Path(*module.split(".")).with_suffix("").with_name(module.rpartition(".")[2] + suffix)
        modules[module] = {"so": str(so), "sha256": digests[module]}
    if compiler == "cython":
        import Cython

        group_lib, version = "", f"cython {Cython.__version__}"
    else:
        from mypy.version import __version__ as mypy_version

        group_lib, version = f"{native.GROUP}__mypyc{suffix}", f"mypy {mypy_version}"
    manifest = {"modules": modules, "group_lib": group_lib, "compiler": compiler, "version": version,
                "python": sys.version.split()[0], "opt_level": opt_level,
                "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    # The sources must not have moved under the build: digests taken before it.
    for module in native.MODULES:
        if native.digest(native.source_path(module)) != digests[module]:
            raise SystemExit(f"{module} changed during the build; run it again")
    (directory / native.MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.native_build")
    ap.add_argument("--force", action="store_true", help="rebuild even if up to date")
    ap.add_argument("--opt-level", default="3")
    ap.add_argument("--compiler", choices=("mypyc", "cython"), default="mypyc")
    ap.add_argument("--out", metavar="DIR", help="build there (default: build/native/<tag>)")
    args = ap.parse_args(argv)
    if native.pure_requested():
        print(f"hot path: {native.ENV_PURE}=1, not compiling")
        return 0
    directory = Path(args.out).absolute() if args.out else native.build_dir()
    if not args.force and current(directory, args.compiler):
        print(f"hot path: compiled modules in {directory} are up to date")
        return 0
    os.chdir(native.ROOT)
    started = time.monotonic()
    build(directory, opt_level=args.opt_level, compiler=args.compiler)
    print(f"hot path: {args.compiler} compiled {len(native.MODULES)} modules into {directory} "
          f"in {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
