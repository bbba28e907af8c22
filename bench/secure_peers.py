"""`quire bench --secure`: quire's secure path against JetStream with TLS, same run.

Both sides run R=3 on loopback with TLS on every hop and verified client certificates
(one local CA, tools/tls_certs.py):

  * quire: etcd and three coordinators with capability tokens and mTLS (`--auth-keys-file
    --tls-cert --tls-key --tls-ca --tls-client-auth`, the `tls` variant of bench/secure.py:
    client → primary and primary → replicas all TLS), driven by `quire.client.Client` with
    a token and a client certificate;
  * NATS JetStream: three `nats-server` (bench/peer_nats.py) with `tls { verify: true }` on
    the client port and on the cluster routes, a stream of three file-store replicas,
    `nats-py` connecting with the same CA and a client certificate.

Shapes (bench/closed_loop.py, one operation in flight per task): 1 KiB ×1, 1 KiB ×64,
64 KiB ×8; every repetition runs each shape on both systems back to back in an order that
alternates, and a ratio (quire ÷ JetStream, ops/s) is taken inside one repetition;
`summary` gives each figure's median and spread. Latency p50/p99 is send to
acknowledgement at the client. The run also records whether kernel TLS could be used
here (protocol/ktls.py): neither side's Python TLS runs over kTLS when it cannot.
"""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from protocol import Codec, FragmentSpec, JournalSpec
from protocol.auth import Capability, Keyring, Scope
from protocol.errors import Unavailable
from protocol.ktls import ktls_status
from protocol.tls import client_context
from quire.client import Client
from tools.lifetime import dying_with_us
from tools.services import EtcdService, free_port
from tools.tls_certs import make_local_ca

from .common import coordinator_argv, stop_processes
from .matrix import append_case
from .peer_nats import NatsCluster, NatsDriver
from .peers import size_name
from .replicated import summarize

__all__ = ["SECURE_SHAPES", "run_secure", "secure_ratios"]

SECURE_SHAPES = ((1 << 10, 1), (1 << 10, 64), (64 << 10, 8))
JOURNAL = "bench/secure-r3"


def _case(size: int, conc: int) -> str:
    return f"{size_name(size)}_c{conc}"


def secure_ratios(fig: dict[str, float]) -> dict[str, float]:
    """quire TLS ÷ JetStream TLS (ops/s) per shape, and the p99 ratio (lower: quire's)."""
    out: dict[str, float] = {}
    for size, conc in SECURE_SHAPES:
        case = _case(size, conc)
        q, n = fig.get(f"quire_tls_{case}_ops"), fig.get(f"nats_tls_{case}_ops")
        if q is not None and n:
            out[f"ratio_quire_tls_r3_{case}_vs_nats_tls"] = q / n
        q, n = fig.get(f"quire_tls_{case}_p99_ms"), fig.get(f"nats_tls_{case}_p99_ms")
        if q is not None and n:
            out[f"ratio_quire_tls_r3_{case}_p99_vs_nats_tls"] = q / n
    return out


async def _repetitions(client: Client, nats: NatsDriver, repeat: int, seconds: float,
                       say: Callable[[str], None]) -> list[dict[str, float]]:
    reps: list[dict[str, float]] = []
    for rep in range(repeat):
        fig: dict[str, float] = {}
        for size, conc in SECURE_SHAPES:
            case = _case(size, conc)
            runs: list[tuple[str, Callable[[], Awaitable[dict[str, Any]]]]] = [
                ("quire_tls", lambda: append_case(client, JOURNAL, size, conc, seconds=seconds)),
                ("nats_tls", lambda: nats.one_in_flight(size, conc, seconds)),
            ]
            for name, run in runs[rep % 2:] + runs[:rep % 2]:
                res = await run()
                fig[f"{name}_{case}_ops"] = res["ops_per_s"]
                fig[f"{name}_{case}_mbps"] = res["mbps"]
                for q in ("p50_ms", "p99_ms"):
                    if res.get(q) == res.get(q):  # not NaN
                        fig[f"{name}_{case}_{q}"] = res[q]
                if res.get("errors"):
                    fig[f"{name}_{case}_errors"] = res["errors"]
            say(f"secure rep {rep + 1} {case}: quire TLS {fig[f'quire_tls_{case}_ops']:,.0f}/s, "
                f"JetStream TLS {fig[f'nats_tls_{case}_ops']:,.0f}/s")
        fig.update(secure_ratios(fig))
        reps.append(fig)
    return reps


def run_secure(workdir: Path, *, repeat: int, seconds: float,
               say: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Start both secure clusters, run `repeat` repetitions, stop everything."""
    workdir.mkdir(parents=True, exist_ok=True)
    status = ktls_status()
    out: dict[str, Any] = {"repeat": repeat, "seconds_per_case": seconds, "ktls": status.line(),
                           "loadavg_start": os.getloadavg()[0]}
    ca = make_local_ca(workdir / "tls")
    key = os.urandom(32)
    keys = workdir / "keys"
    keys.write_text(base64.b64encode(key).decode() + "\n")
    keys.chmod(0o600)
    token = Keyring([key]).mint(Capability.APPEND | Capability.APPLY | Capability.LIST
                                | Capability.READ, Scope.of(["bench/"]), 3600, "bench")
    extra = ["--auth-keys-file", str(keys), "--tls-cert", ca.cert, "--tls-key", ca.key,
             "--tls-ca", ca.ca, "--tls-client-auth"]
    ctx = client_context(ca.ca, ca.cert, ca.key)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with EtcdService("bench-secure-peers-etcd", workdir=workdir / "etcd") as etcd, \
                NatsCluster(workdir / "nats", tls=ca) as nats_cluster:
            endpoints = []
            for i in range(3):
                endpoints.append(f"127.0.0.1:{free_port()}")
                with open(workdir / f"coord-{i}.log", "wb") as log:
                    procs.append(subprocess.Popen(
                        dying_with_us(coordinator_argv(
                            zone=f"z{i % 2}", suffix=f"secure-{i}", listen=endpoints[-1],
                            etcd_url=etcd.url, root="/quire-bench-secure-peers",
                            spool_dir=str(workdir / f"spool-{i}"), extra=extra)),
                        stdout=log, stderr=subprocess.STDOUT))

            async def main() -> list[dict[str, float]]:
                client = Client(endpoints, token=token, ssl=ctx, retry_timeout=30)
                try:
                    spec = JournalSpec(name=JOURNAL, replication=3, fragment=FragmentSpec(
                        length=1 << 28, compression_codec=Codec.NONE))
                    async with asyncio.timeout(180):  # the coordinators are starting
                        while True:
                            try:
                                await client.apply([spec])
                                break
                            except Unavailable:
                                await asyncio.sleep(0.2)
                    # The first append waits out the coordinators' start and the assignment.
                    await client.append(JOURNAL, b"", retry_timeout=180)
                    async with NatsDriver(nats_cluster.urls, tls=ctx) as nats:
                        # Warm up every shape on both, then 3 s more of quire's 1 KiB x1:
                        # without it the first 1 KiB x1 measured after the start ran
                        # 10-20x slower than the same case a pass later (2026-11-29).
                        for size, conc in SECURE_SHAPES:
                            await append_case(client, JOURNAL, size, conc, seconds=0.5)
                            await nats.one_in_flight(size, conc, 0.5)
                        res = await append_case(client, JOURNAL, 1 << 10, 1, seconds=3.0)
                        say(f"secure warm-up: quire 1k x1 {res['ops_per_s']:,.0f}/s p50 {res['p50_ms']:.2f} ms")
                        return await _repetitions(client, nats, repeat, seconds, say)
                finally:
                    await client.close()

            reps = asyncio.run(main())
    finally:
        stop_processes(procs)
    out["repetitions"] = reps
    out["summary"] = summarize(reps)
    out["loadavg_end"] = os.getloadavg()[0]
    return out
