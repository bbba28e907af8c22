"""R=3 64 KiB appends with auth and TLS on, beside plain TCP, in the same run.

    python -m bench.secure [--seconds 3] [--rounds 2] [--uvloop-client] [--json OUT]

    from bench.secure import secure_figures
    fig = secure_figures(seconds=3.0)   # {"plain": {...}, "auth": {...}, "tls": {...}, "ratios": {...}}

One etcd, three clusters of three coordinators each (different etcd roots) started
side by side: `plain` (no auth, plain TCP), `auth` (capability tokens checked; peers
present derived tokens), `tls` (tokens plus TLS with client certificates on every socket,
mTLS between the coordinators), and a fourth, `secure`, on a second etcd as
`quire up --secure` runs it: etcd over TLS with client certificates and RBAC (the
coordinators are etcd's `quire` user, limited to their root prefix), tokens and mTLS. Each cluster gets one R=3 journal (codec none); the
client drives its primary with 16 connections appending 64 KiB back to back. Phases
alternate plain / auth / tls for `rounds` rounds, so load swings on a shared machine hit
every variant alike; the figures are the best round of each, and the ratios compare
them to plain. Tokens are checked once per connection (at Hello), so `auth` should cost
next to nothing; TLS costs encryption of every byte on three hops (client → primary →
two replicas).

Each phase also reports the CPU time (user + sys, µs) every process spent per append —
the client (this process), the journal's primary and its two replicas — and `cpu_ratios`
compares their totals to plain's: on a shared machine the rates swing with the others'
load, the CPU per append much less, and it says where a variant's cost goes.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import shutil
import ssl as ssl_module
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import (append_once, coordinator_argv, cpu_snapshot, drive, hello,
                          stop_processes, write_json)
from protocol import (
    AppendResponse, ApplyChange, ApplyRequest,
    ApplyResponse, Codec, FragmentSpec, JournalSpec, ListRequest, ListResponse,
    Status,
)
from protocol.auth import Capability, Keyring, Scope
from protocol.stream import FrameStream
from protocol.tls import client_context
from tools.lifetime import dying_with_us
from tools.services import EtcdService, free_port
from tools.secure_cluster import bootstrap_etcd, prepare
from tools.tls_certs import make_local_ca

__all__ = ["secure_figures", "main"]

JOURNAL = "bench/secure"
SIZE = 64 << 10
CONNS = 16
VARIANTS = ("plain", "auth", "tls", "secure")


@dataclass
class Variant:
    name: str
    endpoints: list[str]
    token: str = ""
    ssl: ssl_module.SSLContext | None = None
    primary: str = ""
    pids: list[int] = field(default_factory=list)
    rounds: list[dict] = field(default_factory=list)


async def _hello(v: Variant, endpoint: str) -> FrameStream:
    return await hello(endpoint, ssl=v.ssl, token=v.token)


async def _append(s: FrameStream, data: bytes) -> AppendResponse:
    return await append_once(s, JOURNAL, data)


async def _prepare(v: Variant, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while True:  # the coordinators are starting
        try:
            s = await _hello(v, v.endpoints[0])
            break
        except (OSError, ssl_module.SSLError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)
    spec = JournalSpec(name=JOURNAL, replication=3,
                       fragment=FragmentSpec(length=1 << 28, compression_codec=Codec.NONE))
    await s.send(ApplyRequest(changes=(ApplyChange(upsert=spec, expect_mod_revision=-1),)))
    await s.read_message(ApplyResponse)
    while True:  # the route forms and the pipeline syncs
        try:
            if (await _append(s, b"")).status == Status.OK:
                break
        except Exception:  # noqa: BLE001 - answered early and closed: not ready yet
            pass
        await s.close()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{v.name}: the journal never became appendable")
        await asyncio.sleep(0.1)
        s = await _hello(v, v.endpoints[0])
    await s.send(ListRequest())
    listing, _ = await s.read_message(ListResponse)
    await s.close()
    route = next(e.route for e in listing.journals if e.spec.name == JOURNAL)
    suffix = route.members[route.primary].suffix  # listed routes may omit endpoints
    v.primary = v.endpoints[int(suffix.rpartition("-")[2])]


def _roles(v: Variant) -> dict[str, int]:
    """The variant's coordinator processes by their part in its journal's route."""
    roles: dict[str, int] = {}
    replicas = 0
    for endpoint, pid in zip(v.endpoints, v.pids):
        if endpoint == v.primary:
            roles["primary"] = pid
        else:
            replicas += 1
            roles[f"replica-{replicas}"] = pid
    return roles


async def _phase(v: Variant, seconds: float) -> dict:
    streams = [await _hello(v, v.primary) for _ in range(CONNS)]
    roles = _roles(v)
    before = cpu_snapshot(roles)
    count, elapsed = await drive(streams, JOURNAL, os.urandom(SIZE), seconds, close=False)
    after = cpu_snapshot(roles)
    for s in streams:
        await s.close()
    cpu = {k: round((after[k] - before[k]) / max(count, 1) * 1e6) for k in after}
    cpu["total"] = sum(cpu.values())
    return {"appends": count, "seconds": round(elapsed, 2),
            "mb_s": round(count * SIZE / elapsed / 1e6, 1), "load_avg_1m": os.getloadavg()[0],
            "cpu_us_per_append": cpu}


async def _drive(variants: list[Variant], seconds: float, rounds: int) -> None:
    for v in variants:
        await _prepare(v)
        await _phase(v, min(1.0, seconds))  # warm up
    for _ in range(rounds):
        for v in variants:
            v.rounds.append(await _phase(v, seconds))


def secure_figures(seconds: float = 3.0, rounds: int = 2, uvloop_client: bool = False) -> dict:
    """Run the four clusters side by side; returns the figures (see the module doc).
    `uvloop_client`: the client's loop is uvloop too (the coordinators' always is)."""
    work = tempfile.mkdtemp(prefix="quire-bench-secure-")
    procs: list[subprocess.Popen] = []
    try:
        ca = make_local_ca(os.path.join(work, "tls"))
        key = os.urandom(32)
        keys = os.path.join(work, "keys")
        with open(keys, "w") as f:
            f.write(base64.b64encode(key).decode() + "\n")
        os.chmod(keys, 0o600)
        token = Keyring([key]).mint(Capability.APPEND | Capability.APPLY | Capability.LIST,
                                    Scope.of(["bench/"]), 3600, "bench")
        extra = {"plain": [], "auth": ["--auth-keys-file", keys],
                 "tls": ["--auth-keys-file", keys, "--tls-cert", ca.cert, "--tls-key", ca.key,
                         "--tls-ca", ca.ca, "--tls-client-auth"]}
        extra["secure"] = extra["tls"]
        ssl_ctx = client_context(ca.ca, ca.cert, ca.key)
        variants = [Variant("plain", []), Variant("auth", [], token=token),
                    Variant("tls", [], token=token, ssl=ssl_ctx),
                    Variant("secure", [], token=token, ssl=ssl_ctx)]
        files = prepare(Path(work), ca)
        with EtcdService("bench-secure-etcd") as etcd, \
                EtcdService("bench-secure-etcd-tls", tls=ca, probe_cert=files.etcd_root) as tls_etcd:
            bootstrap_etcd(tls_etcd.url, files, "/quire-bench-secure")
            q = files.etcd_quire
            etcd_env = {"QUIRE_ETCD_CA": q.ca, "QUIRE_ETCD_CERT": q.cert, "QUIRE_ETCD_KEY": q.key}
            for v in variants:
                secure = v.name == "secure"
                for i in range(3):
                    v.endpoints.append(f"127.0.0.1:{free_port()}")
                    log = open(os.path.join(work, f"{v.name}-{i}.log"), "wb")  # noqa: SIM115
                    procs.append(proc := subprocess.Popen(
                        dying_with_us(coordinator_argv(
                            zone=f"z{i % 2}", suffix=f"{v.name}-node-{i}",
                            listen=v.endpoints[-1],
                            etcd_url=tls_etcd.url if secure else etcd.url,
                            root=f"/quire-bench-{v.name}",
                            spool_dir=os.path.join(work, f"spool-{v.name}-{i}"),
                            extra=extra[v.name])),
                        stdout=log, stderr=subprocess.STDOUT,
                        env={**os.environ, **etcd_env} if secure else None))
                    v.pids.append(proc.pid)
                    log.close()
            if uvloop_client:
                import uvloop

                uvloop.run(_drive(variants, seconds, rounds))
            else:
                asyncio.run(_drive(variants, seconds, rounds))
    finally:
        stop_processes(procs)
        if not os.environ.get("QUIRE_BENCH_KEEP"):
            shutil.rmtree(work, ignore_errors=True)
    out: dict = {"benchmark": "append_r3_64k_secure", "append_bytes": SIZE, "connections": CONNS,
                 "rounds": rounds, "seconds_per_phase": seconds,
                 "client_loop": "uvloop" if uvloop_client else "asyncio"}
    for v in variants:
        best = max(v.rounds, key=lambda r: r["mb_s"])
        out[v.name] = {**best, "all_mb_s": [r["mb_s"] for r in v.rounds],
                       "all_cpu_us": [r["cpu_us_per_append"]["total"] for r in v.rounds]}
    plain = out["plain"]["mb_s"] or 1.0
    out["ratios"] = {f"{name}_vs_plain": round(out[name]["mb_s"] / plain, 2)
                     for name in ("auth", "tls", "secure")}
    # Plain's CPU per append over each variant's (medians of the rounds): the throughput
    # ratio these costs allow on a CPU-bound machine, steadier than the rates themselves.
    plain_cpu = _median(out["plain"]["all_cpu_us"]) or 1
    out["cpu_ratios"] = {
        f"{name}_vs_plain": round(plain_cpu / max(_median(out[name]["all_cpu_us"]), 1), 2)
        for name in ("auth", "tls", "secure")}
    return out


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2 if xs else 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.secure")
    ap.add_argument("--seconds", type=float, default=3.0, help="seconds per phase")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--uvloop-client", action="store_true",
                    help="run the client on uvloop too (the coordinators always are)")
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args(argv)
    fig = secure_figures(args.seconds, args.rounds, args.uvloop_client)
    for name in VARIANTS:
        r = fig[name]
        print(f"64 KiB appends, R=3, {CONNS} connections, {name:6s}: {r['mb_s']:7.1f} MB/s  "
              f"(rounds {r['all_mb_s']}, load {r['load_avg_1m']:.1f}; CPU µs/append "
              f"{r['cpu_us_per_append']}, totals by round {r['all_cpu_us']})")
    print(f"ratios: {fig['ratios']}")
    print(f"CPU ratios (plain's CPU per append / the variant's, medians): {fig['cpu_ratios']}")
    write_json(args.json, fig)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
