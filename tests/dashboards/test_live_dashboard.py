"""`quire dashboard` against a real cluster: the session etcd, two coordinator
subprocesses (tests/coordinator/cluster.py), the dashboard as a subprocess; then
/api/state over HTTP and the page rendered by headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from quire.client import Client
from protocol import LabelSet
from tools.services import EtcdService, Service, free_port
from tests.coordinator.cluster import Cluster, spec, wait_appendable

pytestmark = pytest.mark.timeout(180)

JOURNAL = "dash/clicks/part-000"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def http_get(url: str, method: str = "GET", timeout: float = 10.0) -> tuple[int, str, bytes]:
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read()


def get_state(url: str) -> dict:
    status, ctype, body = http_get(url + "api/state")
    assert status == 200 and ctype == "application/json", (status, body[:200])
    return json.loads(body)


@pytest.fixture(scope="module")
async def cluster(etcd: EtcdService) -> AsyncIterator[Cluster]:
    root = f"/quire-dash-{uuid.uuid4().hex[:8]}"
    c = Cluster(etcd.url, root, tempfile.mkdtemp(prefix="quire-dash-"))
    try:
        for zone, suffix in (("zone-a", "dash-a1"), ("zone-b", "dash-b1")):
            c.start(c.add(zone, suffix))
        for node in c.nodes:
            await c.wait_listening(node)
        yield c
    finally:
        c.stop_all()
        etcd.delete_prefix(root)
        shutil.rmtree(c.workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def dashboard(cluster: Cluster) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}/"

    def healthy() -> bool:
        return http_get(url + "healthz", timeout=1.0)[0] == 200

    argv = [sys.executable, "-m", "dashboards.main", "--etcd", cluster.etcd_url,
            "--root", cluster.root, "--listen", f"127.0.0.1:{port}", "--log-format", "json"]
    svc = Service("dashboard", argv, probe=healthy, ready_timeout=30)
    svc.start()
    try:
        yield url
    finally:
        svc.stop()
        svc.close()


@pytest.fixture(scope="module")
async def applied(cluster: Cluster, dashboard: str) -> dict:
    client = Client([n.endpoint for n in cluster.nodes])
    try:
        journal = spec(JOURNAL, replication=2)
        journal = type(journal)(name=journal.name, replication=2, fragment=journal.fragment,
                                labels=LabelSet.of(topic="clicks", tier="hot"))
        await client.apply([journal])
        resp = await wait_appendable(cluster.nodes[0].endpoint, JOURNAL)
        assert resp.status.name == "OK", resp
        result = await client.append(JOURNAL, b"hello dashboard\n" * 4)
    finally:
        await client.close()
    return {"end": result.end}


def wait_state(url: str, ok, timeout: float = 30.0) -> dict:  # noqa: ANN001
    """Poll /api/state until `ok(state)` (the allocator and pipeline sync take a moment)."""
    deadline = time.monotonic() + timeout
    state = get_state(url)
    while not ok(state):
        if time.monotonic() > deadline:
            raise AssertionError(f"state not reached in {timeout}s: {json.dumps(state)[:2000]}")
        time.sleep(0.2)  # the dashboard caches snapshots for 1 s
        state = get_state(url)
    return state


def test_api_state_shows_journal_and_brokers(cluster: Cluster, dashboard: str, applied: dict) -> None:
    def ready(state: dict) -> bool:
        j = next((j for j in state["journals"] if j["name"] == JOURNAL), None)
        return bool(j and j["consistency"] == "consistent" and j["write_head"] == applied["end"])

    state = wait_state(dashboard, ready)
    j = next(j for j in state["journals"] if j["name"] == JOURNAL)
    assert j["labels"] == {"tier": ["hot"], "topic": ["clicks"]}
    assert j["replication"] == 2 and len(j["route"]) == 2
    assert j["primary"] in j["route"]
    by_id = {b["id"]: b for b in state["brokers"]}
    assert set(by_id) == {"zone-a#dash-a1", "zone-b#dash-b1"}
    assert j["primary_endpoint"] == by_id[j["primary"]]["endpoint"]
    assert {b["endpoint"] for b in by_id.values()} == {n.endpoint for n in cluster.nodes}
    assert sum(b["primaries"] for b in by_id.values()) == 1
    assert all(b["journals"] == 1 and b["reported"] == {"assigned": 1, "primaries": b["primaries"]}
               for b in by_id.values())
    assert state["etcd"]["root"] == cluster.root and state["etcd"]["revision"] > 0
    assert state["etcd"]["leader"] in by_id
    assert state["errors"] == []


def test_http_routes(dashboard: str) -> None:
    status, ctype, body = http_get(dashboard)
    assert status == 200 and ctype.startswith("text/html") and b"/app.js" in body
    assert http_get(dashboard + "app.js")[1].startswith("text/javascript")
    assert http_get(dashboard + "style.css")[1].startswith("text/css")
    assert http_get(dashboard + "api/state", method="HEAD")[:2] == (200, "application/json")
    assert http_get(dashboard + "nope")[0] == 404
    assert http_get(dashboard + "api/state", method="POST")[0] == 405


def chromium(url: str, *extra: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="quire-chromium-") as profile:
        argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", f"--user-data-dir={profile}", "--virtual-time-budget=5000",
                *extra, url]
        return subprocess.run(argv, capture_output=True, timeout=timeout,
                              env={**os.environ, "HOME": profile})


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (make system-deps)")
def test_browser_renders_journal_and_brokers(dashboard: str, applied: dict) -> None:
    wait_state(dashboard, lambda s: any(j["name"] == JOURNAL and j["primary"] for j in s["journals"]))
    proc = chromium(dashboard, "--dump-dom")
    dom = proc.stdout.decode(errors="replace")
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    assert 'data-ready="1"' in dom, dom[:2000]
    assert f'data-journal="{JOURNAL}"' in dom
    assert "zone-a#dash-a1" in dom and "zone-b#dash-b1" in dom
    assert "topic=clicks" in dom


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (make system-deps)")
def test_browser_screenshot(dashboard: str, applied: dict, tmp_path: Path) -> None:
    """A screenshot for a human to look at (QUIRE_DASHBOARD_SCREENSHOT=path keeps it)."""
    shot = Path(os.environ.get("QUIRE_DASHBOARD_SCREENSHOT") or tmp_path / "dashboard.png")
    proc = chromium(dashboard, f"--screenshot={shot}", "--window-size=1280,800")
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
