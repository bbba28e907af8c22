"""A replicated peer: NATS JetStream, three `nats-server` processes, a stream of three
file-store replicas, driven from Python (`nats-py`) as its users drive it.

The servers run on loopback with their own ports and store directories; each case
publishes to a fresh subject of one stream `BENCH` (`num_replicas=3`, file storage), and
`js.publish` returns only after the stream's leader has the message on a quorum of its
replicas — the acknowledgement a JetStream user waits for. `max_payload` is 8 MiB so the
1 MiB case fits (NATS's default is 1 MiB, headers included).

    shapes: one publish in flight per task (`js.publish` awaited), N tasks over one
            connection (a NATS client multiplexes); batched: publishes without waiting,
            up to `window` acknowledgements outstanding (what an async publisher does).
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import time
from pathlib import Path
from typing import Any

from tools.services import Service, ServiceError, free_port

from .closed_loop import closed_loop, windowed

__all__ = ["NatsCluster", "NatsDriver"]

STREAM = "BENCH"


class _NatsServer(Service):
    ready_timeout = 20.0

    def __init__(self, name: str, config: Path, port: int, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.config, self.port = config, port

    def build_argv(self) -> list[str]:
        exe = shutil.which("nats-server") or "/usr/sbin/nats-server"
        if not Path(exe).exists():
            raise ServiceError("nats-server not found; `make bench` installs the Debian package")
        return [exe, "-c", str(self.config)]

    def probe(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as s:
            return s.recv(4).startswith(b"INFO")


class NatsCluster:
    """Three JetStream servers routed to each other on loopback."""

    def __init__(self, workdir: Path, size: int = 3, tls: Any = None) -> None:
        self.tls = tls
        self.ports = [free_port() for _ in range(size)]
        routes = [free_port() for _ in range(size)]
        self.servers: list[_NatsServer] = []
        for i in range(size):
            d = workdir / f"nats-{i}"
            d.mkdir(parents=True, exist_ok=True)
            conf = d / "nats.conf"
            tls_block = "" if tls is None else (
                f'tls {{ cert_file: "{tls.cert}"\n  key_file: "{tls.key}"\n'
                f'  ca_file: "{tls.ca}"\n  verify: true\n  timeout: 5 }}\n')
            conf.write_text(
                f'server_name: n{i}\nlisten: "127.0.0.1:{self.ports[i]}"\n'
                "max_payload: 8MB\nmax_pending: 64MB\n" + tls_block +
                f'jetstream {{ store_dir: "{d / "js"}" }}\n'
                f'cluster {{ name: quire-bench\n  listen: "127.0.0.1:{routes[i]}"\n'
                + ("  " + tls_block if tls is not None else "") +
                "  routes: [" + ", ".join(f'"nats://127.0.0.1:{p}"' for j, p in enumerate(routes)
                                          if j != i) + "] }\n")
            self.servers.append(_NatsServer(f"nats-{i}", conf, self.ports[i], workdir=d))

    @property
    def urls(self) -> list[str]:
        scheme = "tls" if self.tls is not None else "nats"
        return [f"{scheme}://127.0.0.1:{p}" for p in self.ports]

    def __enter__(self) -> NatsCluster:
        try:
            for s in self.servers:
                s.start(wait=False)
            for s in self.servers:
                s.wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for s in self.servers:
            s.close()

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _stream(nc: Any, timeout: float = 60.0) -> None:
    """Create the R=3 stream, waiting for the cluster's meta leader to be elected (each
    attempt bounded by 2 s, so a request sent before the election is retried)."""
    from nats.js.api import StorageType, StreamConfig

    js = nc.jetstream(timeout=2.0)
    deadline = time.monotonic() + timeout
    while True:
        try:
            await js.add_stream(StreamConfig(name=STREAM, subjects=["bench.>"], num_replicas=3,
                                             storage=StorageType.FILE))
            return
        except Exception as exc:  # noqa: BLE001 - no meta leader yet
            if time.monotonic() > deadline:
                raise ServiceError(f"JetStream stream not created in {timeout:g} s: {exc}") from exc
            await asyncio.sleep(0.25)


class NatsDriver:
    """One client connection to the cluster and the stream; runs the bench's shapes."""

    def __init__(self, urls: list[str], tls: Any = None) -> None:
        self.urls = urls
        self.tls = tls
        """An ssl.SSLContext for a TLS cluster (its client certificate included)."""
        self.nc: Any = None
        self.js: Any = None
        self._n = 0

    async def __aenter__(self) -> NatsDriver:
        import nats

        self.nc = await nats.connect(servers=self.urls, max_reconnect_attempts=3,
                                     pending_size=256 << 20, tls=self.tls,
                                     tls_hostname="127.0.0.1" if self.tls else None)
        await _stream(self.nc)
        self.js = self.nc.jetstream(timeout=30.0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.nc.close()

    def _subject(self) -> str:
        self._n += 1
        return f"bench.s{self._n}"

    async def one_in_flight(self, size: int, concurrency: int, seconds: float) -> dict[str, Any]:
        payload, subject, js = bytes(size), self._subject(), self.js

        async def publish(_task: int) -> None:
            await js.publish(subject, payload)

        return await closed_loop(publish, size, concurrency, seconds=seconds)

    async def batched(self, size: int, window: int, seconds: float) -> dict[str, Any]:
        payload, subject, js = bytes(size), self._subject(), self.js
        return await windowed(lambda: asyncio.ensure_future(js.publish(subject, payload)),
                              size, window, seconds=seconds)
