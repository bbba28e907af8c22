"""Finding the local cluster `quire up` runs, when nothing else says where one is.

`quire up` writes `<data-dir>/env` while it runs: the `export` lines a client needs
(broker, etcd, Redis, store, and with --auth/--tls the token and TLS files), headed by
the pid of the `quire up` process that owns them, and removes it when it stops. Any
process that loads its settings (protocol.config.load_settings) looks there — in
`$QUIRE_DATA_DIR`, else the default data dir — and takes from it what nothing explicit
set: a variable, a config file or a flag always wins, and so does any variable of the
same security group (a shell that sets one QUIRE_TLS_* or its own QUIRE_TOKEN gets
none of the discovered ones of that group, so credentials are never mixed).

The file is taken only while the pid in its head is alive, so a cluster killed with
`kill -9` is not "found" by later commands. `QUIRE_DISCOVER=0` turns discovery off
(`quire up` sets it for its own members, whose settings are exactly those it gives).

This module does file reads and a signal-0 liveness check, nothing else: no sockets.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path

__all__ = ["ENV_FILE", "ClusterEnv", "default_data_dir", "discover", "effective_env", "format_env",
           "read_env_file"]

ENV_FILE = "env"
"""The file under a data dir that `quire up` writes while it runs."""

_GROUPS = ("QUIRE_TLS_", "QUIRE_AUTH_", "QUIRE_TOKEN", "QUIRE_ETCD_CA", "QUIRE_ETCD_CERT",
           "QUIRE_ETCD_KEY")
"""Variables that only make sense together: one set explicitly drops the group's
discovered ones (a token of one cluster never meets the CA of another)."""

_HEAD = "# quire up pid "


class ClusterEnv:
    """The parsed `<data-dir>/env`: who wrote it and its variables, in order."""

    def __init__(self, path: Path, pid: int, variables: dict[str, str]) -> None:
        self.path = path
        self.pid = pid
        self.variables = variables

    @property
    def running(self) -> bool:
        return _alive(self.pid)


def format_env(variables: Mapping[str, str], pid: int, data_dir: str | os.PathLike[str]) -> str:
    """The text of `<data-dir>/env`: a head naming the owner, one `export` per variable,
    values shell-quoted so `eval "$(quire env)"` and `. <data-dir>/env` both work."""
    lines = [f"{_HEAD}{pid} — a local cluster in {data_dir}",
             "# in another shell: eval \"$(quire env)\"  (or export QUIRE_DATA_DIR; see docs/cli.md)"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in variables.items()]
    return "\n".join(lines) + "\n"


def read_env_file(path: str | os.PathLike[str]) -> ClusterEnv | None:
    """The file's owner and variables, or None when it is absent or not ours."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError:
        return None
    pid = 0
    variables: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith(_HEAD):
            word = line[len(_HEAD):].split(" ", 1)[0]
            pid = int(word) if word.isdigit() else 0
        elif line.startswith("export "):
            try:
                parts = shlex.split(line[len("export "):])
            except ValueError:
                continue
            if len(parts) == 1 and "=" in parts[0]:
                key, _, value = parts[0].partition("=")
                if key.startswith("QUIRE_"):
                    variables[key] = value
    if not pid:
        return None
    return ClusterEnv(path, pid, variables)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    except OSError:
        return False
    return True


def default_data_dir(env: Mapping[str, str] | None = None) -> Path:
    """$XDG_DATA_HOME/quire, else ~/.local/share/quire: where `quire up` and every process
    keep local state unless QUIRE_DATA_DIR says otherwise."""
    env = os.environ if env is None else env
    base = env.get("XDG_DATA_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local/share")
    return Path(base) / "quire"


def _data_dir(env: Mapping[str, str]) -> Path:
    given = env.get("QUIRE_DATA_DIR")
    return Path(given).expanduser() if given else default_data_dir(env)


def _disabled(env: Mapping[str, str]) -> bool:
    return env.get("QUIRE_DISCOVER", "").strip().lower() in ("0", "false", "no", "off")


def discover(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of a running `quire up` cluster in the data dir `env` points at
    (QUIRE_DATA_DIR or the default), minus every one `env` sets itself or whose group
    it sets; {} when there is none, it is not running, or QUIRE_DISCOVER=0."""
    env = os.environ if env is None else env
    if _disabled(env):
        return {}
    found = read_env_file(_data_dir(env) / ENV_FILE)
    if found is None or not found.running:
        return {}
    explicit = {k for k, v in env.items() if k.startswith("QUIRE_") and v != ""}
    blocked = tuple(g for g in _GROUPS if any(k.startswith(g) for k in explicit))
    return {k: v for k, v in found.variables.items()
            if k not in explicit and not k.startswith(blocked)}


def effective_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default os.environ) with a running local cluster's variables filling what
    it leaves unset: for code that reads QUIRE_* variables itself."""
    env = os.environ if env is None else env
    return {**discover(env), **env}
