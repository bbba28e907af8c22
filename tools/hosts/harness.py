"""N simulated hosts on one machine: a network namespace each, on a virtual switch.

    switch namespace (qhXX-sw): bridge br0
      ├─ port p0 ── eth0 of host h0 (qhXX-h0)  10.213.X.10
      ├─ port p1 ── eth0 of host h1 (qhXX-h1)  10.213.X.11
      ├─ ...
      └─ port o  ── qhXXo in the root namespace (the observer) 10.213.X.1

The root namespace keeps a leg on the switch, so the test, its checker and its clients
reach every host directly. Faults are made where a real network makes them:

- `isolate(host)`: the host's switch port goes down (a pulled cable): nothing reaches
  it, the observer included, and nothing it sends leaves; `heal(host)` brings it back.
- `partition(a, b)`: hosts of group `a` and of group `b` stop hearing each other,
  silently (nftables drops on input inside each host namespace), while both still reach
  the observer and every host outside the two groups; `cut(src, dst)` is one direction.

Everything made here (namespaces, links, processes in them) is removed by `close()`,
which also runs at interpreter exit and on SIGTERM/SIGHUP, and a new harness sweeps
what a killed one left (see tools.hosts.netns).
"""

from __future__ import annotations

import atexit
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tools.hosts import netns
from tools.hosts.netns import NetnsError, NetnsUnavailable
from tools.services.process import Service

__all__ = ["Host", "HostHarness", "NetnsError", "NetnsUnavailable", "available"]

NFT_TABLE = "quire_hosts"
FIRST_HOST = 10
"""Host i gets 10.213.X.(10 + i); the observer 10.213.X.1."""


def available() -> str | None:
    """None when namespaces can be made here, else the one-line reason they cannot."""
    try:
        netns.check_available()
    except NetnsUnavailable as exc:
        return str(exc)
    return None


class Host:
    """One simulated host: a network namespace with one address on the switch."""

    def __init__(self, harness: HostHarness, index: int, zone: str) -> None:
        self.harness = harness
        self.index = index
        self.name = f"h{index}"
        self.ns = f"{harness.tag}-{self.name}"
        self.address = harness.subnet.address(FIRST_HOST + index)
        self.zone = zone
        self.port = f"p{index}"  # its port on the switch
        self.workdir = harness.workdir / self.name
        """This host's disk: services made by `service()` keep their data under it."""

    def argv(self, argv: Sequence[str]) -> list[str]:
        """`argv` as run inside this host."""
        return ["ip", "netns", "exec", self.ns, *argv]

    def run(self, argv: Sequence[str], *, timeout: float = 30.0,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a short command inside this host and wait for it."""
        return subprocess.run(self.argv(argv), capture_output=True, text=True,
                              timeout=timeout, check=check)

    def service(self, name: str, argv: Sequence[str] | None = None, *,
                env: Mapping[str, str] | None = None, probe: Callable[[], bool] | None = None,
                **kwargs: Any) -> Service:
        """A `Service` (not yet started) that runs `argv` inside this host, its workdir
        on this host's disk; the harness stops it on close."""
        kwargs.setdefault("workdir", self.workdir / name)
        return self.adopt(Service(name, argv, env=env, probe=probe, **kwargs))

    def adopt(self, service: Service) -> Service:
        """Make any Service (EtcdService, CeleryWorkerService, ...) run inside this host."""
        service.netns = self.ns
        self.harness._services.append(service)
        return service

    def pids(self) -> list[int]:
        return netns.netns_pids(self.ns)

    def kill_all(self) -> list[int]:
        """kill -9 every process in this host (a power cut); return their pids. Its
        services' data stay on its disk and start again with `.start()`."""
        return netns.kill_netns(self.ns)

    @property
    def isolated(self) -> bool:
        return self in self.harness._isolated

    def __repr__(self) -> str:
        return f"<Host {self.name} {self.address} zone={self.zone}>"


class HostHarness:
    """`n` hosts in network namespaces on one switch, and the root namespace on it too.

    `zones[i]` is host i's zone (default: a zone per host, named like the host).
    `octet` asks for 10.213.<octet>.0/24 (default: any free one: harnesses run
    side by side on one machine, each on its own /24).
    """

    def __init__(self, n: int, zones: Sequence[str] | None = None, *,
                 workdir: str | Path | None = None, octet: int | None = None) -> None:
        if n < 1:
            raise ValueError(f"host harness: need at least one host, got {n}")
        if zones is not None and len(zones) != n:
            raise ValueError(f"host harness: {n} hosts but {len(zones)} zones {list(zones)!r}")
        self.n = n
        self._zones = list(zones) if zones is not None else None
        self._octet = octet
        self._owns_workdir = workdir is None
        self._workdir_arg = workdir
        self.hosts: list[Host] = []
        self._services: list[Service] = []
        self._isolated: set[Host] = set()
        self._cuts: set[tuple[Host, Host]] = set()
        self._started = False
        self._closed = False
        self._lock = threading.Lock()
        self.subnet: netns.Subnet | None = None

    # -- names ----------------------------------------------------------------------

    @property
    def tag(self) -> str:
        return self._require().tag

    @property
    def switch_ns(self) -> str:
        return f"{self.tag}-sw"

    @property
    def observer_link(self) -> str:
        return f"{self.tag}o"

    @property
    def observer_address(self) -> str:
        """The root namespace's address on the switch (where tests and clients run)."""
        return self._require().address(1)

    @property
    def cidr(self) -> str:
        return self._require().cidr

    def _require(self) -> netns.Subnet:
        if self.subnet is None:
            raise NetnsError("host harness not started")
        return self.subnet

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> HostHarness:
        if self._started:
            return self
        netns.check_available()
        netns.sweep_stale()
        self.subnet = netns.reserve_subnet(self._octet)
        self._started = True
        atexit.register(self.close)
        _install_signal_handlers()
        self.workdir = (Path(tempfile.mkdtemp(prefix=f"quire-{self.tag}-"))
                        if self._workdir_arg is None else Path(self._workdir_arg))
        zones = self._zones or [f"h{i}" for i in range(self.n)]
        try:
            self._build_switch()
            for i in range(self.n):
                host = Host(self, i, zones[i])
                self.hosts.append(host)
                self._build_host(host)
        except BaseException:
            self.close()
            raise
        return self

    def _build_switch(self) -> None:
        sw = self.switch_ns
        netns.ip("netns", "add", sw)
        netns.ip("link", "add", "br0", "type", "bridge", ns=sw)
        netns.ip("link", "set", "br0", "up", ns=sw)
        # The observer's leg: one end in the root namespace, the other on the bridge.
        netns.ip("link", "add", self.observer_link, "type", "veth", "peer", "name", "o",
                 "netns", sw)
        netns.ip("link", "set", "o", "master", "br0", "up", ns=sw)
        netns.ip("addr", "add", f"{self.observer_address}/24", "dev", self.observer_link)
        netns.ip("link", "set", self.observer_link, "up")

    def _build_host(self, host: Host) -> None:
        netns.ip("netns", "add", host.ns)
        netns.ip("link", "set", "lo", "up", ns=host.ns)
        netns.ip("link", "add", host.port, "netns", self.switch_ns, "type", "veth",
                 "peer", "name", "eth0", "netns", host.ns)
        netns.ip("link", "set", host.port, "master", "br0", "up", ns=self.switch_ns)
        netns.ip("addr", "add", f"{host.address}/24", "dev", "eth0", ns=host.ns)
        netns.ip("link", "set", "eth0", "up", ns=host.ns)
        host.workdir.mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        """Stop every process of every host and remove every namespace and link."""
        with self._lock:
            if self._closed or not self._started:
                return
            self._closed = True
        errors: list[str] = []
        for svc in reversed(self._services):
            try:
                svc.kill()
            except Exception as exc:  # noqa: BLE001 - keep tearing down
                errors.append(f"{svc.name}: {exc}")
        for host in self.hosts:
            try:
                netns.kill_netns(host.ns)
            except NetnsError as exc:
                errors.append(str(exc))
            netns.ip("netns", "del", host.ns, check=False)
        netns.ip("netns", "del", self.switch_ns, check=False)
        netns.ip("link", "del", self.observer_link, check=False)  # gone with its peer, normally
        if self.subnet is not None:
            self.subnet.release()
        if self._owns_workdir and hasattr(self, "workdir"):
            shutil.rmtree(self.workdir, ignore_errors=True)
        atexit.unregister(self.close)
        if errors:
            raise NetnsError("host harness teardown: " + "; ".join(errors))

    def __enter__(self) -> HostHarness:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- faults ---------------------------------------------------------------------

    def isolate(self, host: Host) -> None:
        """Pull the host's cable: its switch port goes down."""
        netns.ip("link", "set", host.port, "down", ns=self.switch_ns)
        self._isolated.add(host)

    def heal(self, host: Host) -> None:
        netns.ip("link", "set", host.port, "up", ns=self.switch_ns)
        self._isolated.discard(host)

    def cut(self, src: Host, dst: Host) -> None:
        """Packets from `src` stop arriving at `dst` (one direction)."""
        self._cuts.add((src, dst))
        self._apply(dst)

    def partition(self, a: Iterable[Host], b: Iterable[Host]) -> None:
        """Every host of `a` and every host of `b` stop hearing each other (both ways);
        each still reaches the observer and every other host."""
        a, b = list(a), list(b)
        if set(a) & set(b):
            raise ValueError(f"partition: {sorted(h.name for h in set(a) & set(b))} on both sides")
        for x in a:
            for y in b:
                self._cuts.add((x, y))
                self._cuts.add((y, x))
        for host in {*a, *b}:
            self._apply(host)

    def heal_partitions(self) -> None:
        touched = {dst for _, dst in self._cuts}
        self._cuts.clear()
        for host in touched:
            self._apply(host)

    def heal_all(self) -> None:
        self.heal_partitions()
        for host in list(self._isolated):
            self.heal(host)

    def _apply(self, host: Host) -> None:
        """Replace the host's drop rules in one nft transaction."""
        sources = sorted(src.address for src, dst in self._cuts if dst is host)
        rules = f"table inet {NFT_TABLE}\ndelete table inet {NFT_TABLE}\n"
        if sources:
            rules += (f"table inet {NFT_TABLE} {{\n chain input {{\n"
                      f"  type filter hook input priority 0; policy accept;\n"
                      f"  ip saddr {{ {', '.join(sources)} }} drop\n }}\n}}\n")
        netns.ip("-f", "-", ns=host.ns, tool="nft", stdin=rules)

    # -- services -------------------------------------------------------------------

    def etcd_cluster(self, hosts: Sequence[Host], **kwargs: Any) -> Any:
        """An EtcdCluster (not started) with one member on each of `hosts`, listening
        on the host's address; the harness stops it on close."""
        from tools.services.etcd import EtcdCluster

        cluster = EtcdCluster(len(hosts), listen_hosts=[h.address for h in hosts],
                              workdir=self.workdir / "etcd", **kwargs)
        for member, host in zip(cluster.members, hosts, strict=True):
            host.adopt(member)
        return cluster

    def host_of(self, address: str) -> Host | None:
        return next((h for h in self.hosts if h.address == address), None)


_handlers_installed = False


def _install_signal_handlers() -> None:
    """SIGTERM/SIGHUP become SystemExit, so context managers and atexit clean up."""
    global _handlers_installed
    if _handlers_installed or threading.current_thread() is not threading.main_thread():
        return
    _handlers_installed = True

    def _exit(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, _exit)
