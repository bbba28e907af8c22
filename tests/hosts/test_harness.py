"""The host harness itself (netns): hosts reach each other and the observer; a
partition cuts only the hosts it names, silently; an isolated host is cut from
everyone; kill_all leaves nothing running; close and a killed harness leave no
namespace, link or process behind."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tools.hosts import Host, HostHarness, NetnsError
from tools.services import wait_for

ECHO = textwrap.dedent("""
    import socket, sys
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], 7000)); s.listen(64)
    while True:
        c, _ = s.accept(); c.sendall(b"hi"); c.close()
""")


def _server(host: Host) -> None:
    host.service(f"echo-{host.name}", [sys.executable, "-c", ECHO, host.address],
                 probe=lambda: socket.create_connection((host.address, 7000), timeout=1).close()
                 is None).start()


def _reach(frm: Host | None, to: Host) -> bool:
    code = (f"import socket; s = socket.create_connection(({to.address!r}, 7000), timeout=1.0); "
            "print(s.recv(2).decode())")
    if frm is None:
        try:
            with socket.create_connection((to.address, 7000), timeout=1.0) as s:
                return s.recv(2) == b"hi"
        except OSError:
            return False
    return frm.run([sys.executable, "-c", code], check=False).stdout.strip() == "hi"


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_hosts_partitions_isolation_and_cleanup() -> None:
    with HostHarness(3, zones=["a", "a", "b"]) as h:
        a, b, c = h.hosts
        assert [x.zone for x in h.hosts] == ["a", "a", "b"]
        assert len({x.address for x in h.hosts} | {h.observer_address}) == 4
        assert a.argv(["etcd"]) == ["ip", "netns", "exec", a.ns, "etcd"]
        for host in h.hosts:
            _server(host)
        assert _reach(None, a) and _reach(a, b) and _reach(b, c) and _reach(c, a)

        h.partition([a], [b])
        assert not _reach(a, b) and not _reach(b, a)
        assert _reach(a, c) and _reach(b, c) and _reach(None, a) and _reach(None, b)
        h.heal_partitions()
        assert _reach(a, b) and _reach(b, a)

        h.cut(a, b)  # one way: b hears nothing from a, so a's connections to b fail
        assert not _reach(a, b)
        h.heal_partitions()

        h.isolate(c)
        assert c.isolated
        assert not _reach(None, c) and not _reach(a, c) and not _reach(c, a)
        h.heal(c)
        # Its switch port is up again at once, but the neighbours' ARP entries for it
        # failed while it was cut and resolve again on the next packets (retransmitted
        # each second): reachable within a bound, not on the first try.
        wait_for(lambda: _reach(None, c) and _reach(c, a), timeout=15.0,
                 what=f"{c.name} reachable again after the heal")

        assert a.pids()
        killed = a.kill_all()
        assert killed and not a.pids()
        with pytest.raises(ValueError, match="on both sides"):
            h.partition([a], [a, b])
        names = [x.ns for x in h.hosts] + [h.switch_ns]
        tag = h.tag
    listed = _namespaces()
    assert not any(ns in listed for ns in names)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"{tag}o" not in links


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="3 hosts but 2 zones"):
        HostHarness(3, zones=["a", "b"])
    with pytest.raises(ValueError, match="at least one host"):
        HostHarness(0)
    with pytest.raises(NetnsError, match="not started"):
        _ = HostHarness(1).observer_address


def test_a_killed_harness_is_swept_by_the_next(tmp_path: Path) -> None:
    script = tmp_path / "h.py"
    script.write_text(textwrap.dedent("""
        import time
        from tools.hosts import HostHarness
        h = HostHarness(2).start()
        h.hosts[0].service("sleeper", ["sleep", "600"]).start()
        print(h.tag, flush=True)
        time.sleep(600)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2])
    try:
        tag = proc.stdout.readline().strip() if proc.stdout else ""
        assert tag.startswith("qh")
        assert f"{tag}-h0" in _namespaces()
    finally:
        proc.kill()
        proc.wait()
    with HostHarness(1):  # its start sweeps what the killed one left
        assert f"{tag}-h0" not in _namespaces()
    wait_for(lambda: not subprocess.run(["pgrep", "-f", "^sleep 600$"], capture_output=True).stdout,
             timeout=10, what="the killed harness's processes to be gone")
