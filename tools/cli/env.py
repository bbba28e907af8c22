"""`quire env`: the `export` lines of a running `quire up` cluster.

`eval "$(quire env)"` (or `--data-dir DIR` for a cluster elsewhere) sets in any shell
what `quire up` printed; commands find the cluster without it too (protocol/discovery.py),
but other tools (spark-submit, scripts) read the variables.

While `quire up` is still starting (or already stopping) there are no lines to print
yet: it says so, naming the `quire up` (tools/cluster_run.py keeps its state), and
`--wait` waits, bounded by `--wait-timeout`, until the cluster is up.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import typer

from protocol.config import default_data_dir
from protocol.discovery import ENV_FILE, read_env_file
from tools.cluster_run import describe_state, read_state

from .common import EXIT_UNAVAILABLE, CliError

POLL = 0.2
"""Seconds between two looks at the data dir while waiting."""


def env(data_dir: str = typer.Option(None, "--data-dir", help="The cluster's data directory "
                                     "(default: $QUIRE_DATA_DIR or ~/.local/share/quire)."),
        wait: bool = typer.Option(False, "--wait", help="If the cluster is starting (or not "
                                  "started yet), wait until it is up."),
        wait_timeout: float = typer.Option(180.0, "--wait-timeout", min=0,
                                           help="With --wait: the most seconds to wait.")) -> None:
    """Print the export lines of the local cluster running in a data dir (eval-able)."""
    directory = Path(data_dir or os.environ.get("QUIRE_DATA_DIR") or default_data_dir()).expanduser()
    path = directory.absolute() / ENV_FILE
    start = f"quire up{' --data-dir ' + str(directory) if data_dir else ''}"
    deadline = time.monotonic() + wait_timeout
    seen = None
    while True:
        found = read_env_file(path)
        if found is not None and found.running:
            sys.stdout.write(path.read_text())
            sys.stdout.flush()
            return
        up = read_state(directory.absolute())
        if up is not None and up.state == "stopping":
            raise CliError(f"the local cluster in {directory} is stopping: {describe_state(up)}",
                           EXIT_UNAVAILABLE)
        if up is not None and not wait:
            raise CliError(f"the local cluster in {directory} is starting, not up yet: "
                           f"{describe_state(up)}; run `quire env --wait` to wait for it",
                           EXIT_UNAVAILABLE)
        if up is None and seen is not None:
            raise CliError(f"quire up (pid {seen.ident.pid}) in {directory} exited before the "
                           f"cluster was up: see its output ({start} to try again)", EXIT_UNAVAILABLE)
        seen = up or seen
        if not wait:
            why = "no quire up has written" if found is None else f"the quire up (pid {found.pid}) that wrote"
            tail = "" if found is None else " is gone"
            raise CliError(f"no local cluster running in {directory}: {why} {path}{tail} "
                           f"(start one with: {start})", EXIT_UNAVAILABLE)
        if time.monotonic() >= deadline:
            what = (f"still starting after {wait_timeout:g}s: {describe_state(up)}" if up else
                    f"no quire up started there within {wait_timeout:g}s (start one with: {start})")
            raise CliError(f"the local cluster in {directory} is not up: {what}", EXIT_UNAVAILABLE)
        time.sleep(POLL)
