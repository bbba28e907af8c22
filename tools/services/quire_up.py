"""`quire up` itself as a Service: a whole local cluster in a data dir, for tests that
act as a user in a second terminal (tests/cli/test_second_terminal.py, tests/test_docs_run.py).

Ready once `quire up` has written `<data-dir>/env` under its own pid; stopped with
SIGTERM, which drains and stops every member it started within its bound (their process
groups are its own to sweep; Service sweeps its group too). Killed, it takes its
members with it (each has a parent-death signal), as this service dies with the test.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from protocol.discovery import ENV_FILE, read_env_file
from tools.services.process import Service, free_port


class QuireUpService(Service):
    ready_timeout = 180.0
    stop_timeout = 90.0  # past the coordinators' drain (30 s) and the rest's stops

    def __init__(self, data_dir: str | os.PathLike[str], *args: str,
                 env: Mapping[str, str] | None = None, port: int | None = None) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.port = port or free_port()
        argv: Sequence[str] = [sys.executable, "-m", "tools.cli.main", "up", "--data-dir",
                               str(self.data_dir), "--port", str(self.port), *args]
        super().__init__("quire-up", argv, env=env, workdir=self.data_dir.parent / "quire-up-log")

    def probe(self) -> bool:
        found = read_env_file(self.data_dir / ENV_FILE)
        return found is not None and found.pid == self.pid

    def describe(self) -> str:
        return f"quire up in {self.data_dir}"

    @property
    def variables(self) -> dict[str, str]:
        """The cluster's exports, as `quire env` prints them."""
        found = read_env_file(self.data_dir / ENV_FILE)
        return dict(found.variables) if found is not None else {}
