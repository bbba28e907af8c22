"""The network-namespace primitives of the host harness: `ip` and `nft` calls, a
subnet each harness reserves for itself, and the sweep of what a dead harness left.

Every namespace, link and address made here is the harness's own: namespaces are
named `qh<xx>-...` and root-namespace links `qh<xx>...`, where `xx` is the hex of the
third octet of the harness's subnet 10.213.<x>.0/24. A harness holds an exclusive
`flock` on /run/quire-hosts/<x>.lock for its lifetime; the kernel drops that lock when
the process dies however it dies, so a prefix whose lock can be taken belongs to no
live harness and anything still carrying it is swept.
"""

from __future__ import annotations

import fcntl
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

__all__ = [
    "NetnsError",
    "NetnsUnavailable",
    "Subnet",
    "SUBNET_BASE",
    "check_available",
    "ip",
    "netns_pids",
    "kill_netns",
    "reserve_subnet",
    "sweep_stale",
]

SUBNET_BASE = "10.213"
"""Harnesses take /24s of 10.213.0.0/16: private, and unusual enough to be free."""
LOCK_DIR = Path("/run/quire-hosts")
PREFIX = "qh"


class NetnsError(RuntimeError):
    """An `ip` or `nft` command of the harness failed."""


class NetnsUnavailable(NetnsError):
    """Network namespaces cannot be made here (not root, no `ip`); one line says why."""


def check_available() -> None:
    """Raise `NetnsUnavailable` with a one-line reason unless namespaces can be made."""
    if os.name != "posix" or not Path("/proc/self/ns/net").exists():
        raise NetnsUnavailable("host harness: no Linux network namespaces on this system")
    if os.geteuid() != 0:
        raise NetnsUnavailable("host harness: network namespaces need root (run as root, as CI does)")
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            raise NetnsUnavailable(f"host harness: `{tool}` not found; install the Debian package "
                                   f"{package} (make system-deps)")


def ip(*args: str, ns: str | None = None, check: bool = True, stdin: str | None = None,
       tool: str = "ip") -> str:
    """Run `ip ARGS` (or `ip netns exec NS TOOL ARGS`); return stdout."""
    if tool == "ip":
        argv = ["ip", *(["-n", ns] if ns else []), *args]
    else:
        argv = ["ip", "netns", "exec", ns, tool, *args] if ns else [tool, *args]
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise NetnsError(f"{' '.join(argv)}: {proc.stderr.strip() or f'status {proc.returncode}'}")
    return proc.stdout


def netns_pids(ns: str) -> list[int]:
    """Pids of every process whose network namespace is `ns`."""
    out = ip("netns", "pids", ns, check=False)
    return [int(p) for p in out.split() if p.isdigit()]


def kill_netns(ns: str, *, timeout: float = 10.0) -> list[int]:
    """kill -9 every process in `ns` and wait until none is left; return the pids."""
    killed: list[int] = []
    deadline = time.monotonic() + timeout
    while True:
        pids = [p for p in netns_pids(ns) if p != os.getpid() and not _zombie(p)]
        if not pids:
            return killed
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise NetnsError(f"processes {pids} in {ns} survived SIGKILL for {timeout:g}s")
        time.sleep(0.05)


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


class Subnet:
    """10.213.<octet>.0/24, reserved by an exclusive lock held until `release()`."""

    def __init__(self, octet: int, lock_fd: int) -> None:
        self.octet = octet
        self._fd: int | None = lock_fd

    @property
    def tag(self) -> str:
        """The name prefix of everything made for this subnet: `qh` + two hex digits."""
        return f"{PREFIX}{self.octet:02x}"

    def address(self, last: int) -> str:
        return f"{SUBNET_BASE}.{self.octet}.{last}"

    @property
    def cidr(self) -> str:
        return f"{SUBNET_BASE}.{self.octet}.0/24"

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def _try_lock(octet: int) -> int | None:
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(LOCK_DIR / f"{octet}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _routed_octets() -> set[int]:
    """Third octets of 10.213.x.0/24 networks the root namespace already routes."""
    out = ip("-4", "route", "show", check=False)
    found = set()
    for word in out.split():
        if word.startswith(f"{SUBNET_BASE}."):
            try:
                found.add(int(word.split(".")[2]))
            except (IndexError, ValueError):
                pass
    return found


def reserve_subnet(octet: int | None = None) -> Subnet:
    """Lock a free /24 (a given one, or a random free one) and sweep its leftovers."""
    candidates = [octet] if octet is not None else random.sample(range(1, 255), 254)
    for x in candidates:
        fd = _try_lock(x)
        if fd is None:
            continue  # a live harness has it
        subnet = Subnet(x, fd)
        _sweep_tag(subnet.tag)  # a dead harness's leftovers on the octet we now own
        if x in _routed_octets():
            subnet.release()  # routed by something that is not a harness: leave it alone
            continue
        return subnet
    raise NetnsError(f"host harness: no free subnet in {SUBNET_BASE}.0.0/16"
                     + (f" (asked for {SUBNET_BASE}.{octet}.0/24)" if octet is not None else ""))


def _sweep_tag(tag: str) -> list[str]:
    """Remove every namespace and root link named with `tag` (its owner is gone)."""
    removed = []
    for ns in _namespaces():
        if ns.startswith(f"{tag}-"):
            kill_netns(ns)
            ip("netns", "del", ns, check=False)
            removed.append(ns)
    for link in _root_links():
        if link.startswith(tag):
            ip("link", "del", link, check=False)
            removed.append(link)
    return removed


def sweep_stale() -> list[str]:
    """Remove what harnesses that died (their lock is free) left behind."""
    removed: list[str] = []
    tags = {ns.split("-")[0] for ns in _namespaces() if ns.startswith(PREFIX)}
    tags |= {link[:4] for link in _root_links() if link.startswith(PREFIX)}
    for tag in sorted(tags):
        try:
            octet = int(tag[len(PREFIX):], 16)
        except ValueError:
            continue
        fd = _try_lock(octet)
        if fd is None:
            continue  # a live harness owns it
        try:
            removed += _sweep_tag(tag)
        finally:
            os.close(fd)
    return removed


def _namespaces() -> list[str]:
    out = ip("netns", "list", check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _root_links() -> list[str]:
    out = ip("-o", "link", "show", check=False)
    names = []
    for line in out.splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            names.append(parts[1].strip().split("@")[0])
    return names
