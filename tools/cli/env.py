"""`quire env`: the `export` lines of a running `quire up` cluster.

`eval "$(quire env)"` (or `--data-dir DIR` for a cluster elsewhere) sets in any shell
what `quire up` printed; commands find the cluster without it too (protocol/discovery.py),
but other tools (spark-submit, scripts) read the variables.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from protocol.config import default_data_dir
from protocol.discovery import ENV_FILE, read_env_file

from .common import EXIT_UNAVAILABLE, CliError


def env(data_dir: str = typer.Option(None, "--data-dir", help="The cluster's data directory "
                                     "(default: $QUIRE_DATA_DIR or ~/.local/share/quire).")) -> None:
    """Print the export lines of the local cluster running in a data dir (eval-able)."""
    directory = Path(data_dir or os.environ.get("QUIRE_DATA_DIR") or default_data_dir()).expanduser()
    path = directory.absolute() / ENV_FILE
    found = read_env_file(path)
    if found is None or not found.running:
        why = "no quire up has written" if found is None else f"the quire up (pid {found.pid}) that wrote"
        tail = "" if found is None else " is gone"
        raise CliError(f"no local cluster running in {directory}: {why} {path}{tail} "
                       f"(start one with: quire up{' --data-dir ' + str(directory) if data_dir else ''})",
                       EXIT_UNAVAILABLE)
    sys.stdout.write(path.read_text())
    sys.stdout.flush()
