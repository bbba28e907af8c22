"""Helpers of the workers role tests (imported by name; conftest holds only fixtures)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aetcd
import msgspec

from protocol import FragmentSpec, JournalSpec, LabelSet
from tools.services import EtcdService, S3Service
from tools.services.isolation import Bucket

REPO = Path(__file__).resolve().parents[2]


def worker_env(redis_url: str, etcd: EtcdService, etcd_root: str, s3: S3Service | None,
               **extra: str) -> dict[str, str]:
    env = {
        "QUIRE_REDIS_URL": redis_url,
        "QUIRE_ETCD_URL": etcd.url,
        "QUIRE_ETCD_ROOT": etcd_root,
        "QUIRE_LOG_FORMAT": "json",
        "QUIRE_WORKER_IO_TIMEOUT": "10",
        # The repo first on the path: an editable install made before a package
        # directory had its __init__.py maps it as a namespace package.
        "PYTHONPATH": str(REPO),
    }
    if s3 is not None:
        env.update(s3.client_env())
    env.update(extra)
    return env


def s3_url(bucket: Bucket, prefix: str = "") -> str:
    return f"s3://{bucket.name}/{prefix}"


# -- etcd topology --------------------------------------------------------------------

def _client(etcd: EtcdService) -> aetcd.Client:
    return aetcd.Client(host="127.0.0.1", port=etcd.port)


def _run(coro: Any) -> Any:
    """asyncio.run on a fresh thread, so sync helpers work inside async tests too."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result(30)


def put_keys(etcd: EtcdService, items: dict[str, bytes]) -> None:
    async def run() -> None:
        c = _client(etcd)
        try:
            for k, v in items.items():
                await c.put(k.encode(), v)
        finally:
            await c.close()

    _run(run())


def delete_key(etcd: EtcdService, key: str) -> None:
    async def run() -> None:
        c = _client(etcd)
        try:
            await c.delete(key.encode())
        finally:
            await c.close()

    _run(run())


def put_journal(etcd: EtcdService, root: str, name: str, *, stores: tuple[str, ...] = (),
                codec: str = "gzip", refresh: float = 60.0, labels: LabelSet = LabelSet(),
                endpoints: tuple[str, ...] = ()) -> JournalSpec:
    """A journal spec, plus members and assignments so `endpoints` serve it (first = primary)."""
    spec = JournalSpec(name=name, replication=max(1, len(endpoints) or 1), labels=labels,
                       fragment=FragmentSpec(length=1 << 20, compression_codec=codec,
                                             stores=stores, refresh_interval=refresh))
    spec.validate()
    items = {f"{root}/journals/{name}": msgspec.json.encode(spec)}
    for slot, ep in enumerate(endpoints):
        suffix = f"member-{ep.replace(':', '-').replace('.', '-')}"
        items[f"{root}/members/local#{suffix}"] = msgspec.json.encode(
            {"id": {"zone": "local", "suffix": suffix}, "endpoint": ep})
        items[f"{root}/assign/{name}#local#{suffix}#{slot}"] = b"{}"
    put_keys(etcd, items)
    return spec


def coordinator(name: str, *, etcd: EtcdService, root: str, redis_url: str | None,
                spool_dir: str, port: int, metrics_port: int = 0,
                env: dict[str, str] | None = None, extra: tuple[str, ...] = ()) -> Any:
    """A `python -m coordinator.main` process (not started), ready once it accepts TCP."""
    import socket
    import sys

    from tools.services import Service

    argv = [sys.executable, "-m", "coordinator.main", "--zone", "local", "--id", name,
            "--listen", f"127.0.0.1:{port}", "--etcd", etcd.url, "--root", root,
            "--spool-dir", spool_dir, "--lease-ttl", "3", "--log-format", "json"]
    if redis_url:
        argv += ["--redis", redis_url]
    if metrics_port:
        argv += ["--metrics-port", str(metrics_port)]
    argv += list(extra)

    def probe() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True

    return Service(name, argv, env={"PYTHONPATH": str(REPO), **(env or {})}, probe=probe)


def scrape(port: int, metric: str) -> dict[str, float]:
    """Samples of one metric from a /metrics endpoint: {label text: value}."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(metric + "{") or line.startswith(metric + " "):
            name, _, value = line.rpartition(" ")
            out[name[len(metric):]] = float(value)
    return out


async def appendable(client: Any, journal: str) -> bool:
    """True once `journal` takes a (zero-byte) append: its route formed and synced."""
    try:
        await client.append(journal, b"", retry_timeout=2)
        return True
    except Exception:  # noqa: BLE001 - the route is still forming
        return False
