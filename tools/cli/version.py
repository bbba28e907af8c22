"""`quire version`: the package's version, the interpreter, and which hot path runs.

The hot path is the mypyc-compiled modules (`make compiled`, docs/compiled.md) or their
pure-Python sources, and why (`QUIRE_PURE_PYTHON=1`, not built, a stale build):
protocol/native.py decides, once per process, for every process of the tree.
"""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version as package_version

import typer

from protocol.native import HOT_PATH, MODULES


def version(modules: bool = typer.Option(False, "--modules",
                                         help="Also list the modules of the compiled set.")) -> None:
    """Print quire's version, the Python it runs on and whether the hot path is compiled."""
    try:
        release = package_version("quire")
    except PackageNotFoundError:
        release = "unknown (not installed)"
    typer.echo(f"quire {release}")
    typer.echo(f"python {platform.python_version()} ({platform.python_implementation()})")
    typer.echo(f"hot path: {HOT_PATH.describe()}")
    if modules:
        for module in MODULES:
            typer.echo(f"  {module}")
