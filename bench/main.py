"""`quire bench`: quire against its peer and the machine's limits, in one run.

    quire bench --quick --json bench.json

One run starts its own cluster (etcd + N coordinator subprocesses, a file store),
measures quire's appends and AppendService, a private redis-server's XADD, the minimal
R=3 pipeline of bench/pipeline_ref.py (same sizes and concurrency, and the 8-journal
case), SHA-1 and loopback TCP, and a coordinator's RSS with 1/100/1,000 idle journals,
then prints the ratios; then the scale section (bench/scale.py: 5 coordinators, R=3, at
10 and 1,000 journals — 10 and 100 with --quick; 10,000 with `python -m bench.scale`). Every key of the JSON is documented in docs/benchmarks.md ("Bench" section).
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from chaos.cluster import LocalCluster
from quire.client import Client
from protocol.logs import configure_logging
from protocol import Codec, FragmentSpec, JournalSpec
from protocol.ktls import ktls_status
from tools.lifetime import interrupt_on_sigterm

from .limits import measure_limits
from .matrix import append_case, message_rate
from .peers import measure_redis, size_name
from .pipeline_ref import PipelineRef, ref_case
from .replicated import run_replicated
from .rss import measure_rss

__all__ = ["command", "run_bench", "ratios"]

SIZES = (1 << 10, 64 << 10, 1 << 20)
REPLICATION = (1, 3)
CONCURRENCY = (1, 8, 64)
MESSAGE_SIZE = 100
MULTI = 8
FRESH_CASES = ("64k_c8",)
"""Cases also run on the reference writing fresh pages (pipeline_ref.FRESH), as
quire's spools do here: the ratio against it is quire's software alone."""
"""Journals of the many-journal case (R=3, 1 KiB, 64 in flight, primaries spread)."""
MULTI_CASE = f"r3_1k_c64_j{MULTI}"


def _store_case(out: dict[str, Any], key: str, res: dict[str, Any]) -> None:
    for metric in ("ops", "mbps", "p50_ms", "p99_ms"):
        out[f"{key}_{metric}"] = res["ops_per_s" if metric == "ops" else metric]
    if "errors" in res:
        out[f"{key}_errors"] = res["errors"]
        if res.get("first_error"):
            out[f"{key}_first_error"] = res["first_error"]


async def _quire(cluster: LocalCluster, ref: PipelineRef, workdir: Path, seconds: float,
                 msg_seconds: float, say: Any) -> dict[str, Any]:
    """quire's cases; each R=3 case runs right after the same case on the reference
    (bench/pipeline_ref.py), so a ratio compares two runs seconds apart: on a shared
    machine the load drifts, and a reference measured a minute earlier is not a peer."""
    store = (workdir / "store").as_uri() + "/"
    (workdir / "store").mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {}
    client = Client(cluster.endpoints, retry_timeout=30)
    try:
        specs = [JournalSpec(name=f"bench/r{r}", replication=r, fragment=FragmentSpec(
            stores=(store,), compression_codec=Codec.NONE)) for r in REPLICATION]
        specs.append(JournalSpec(name="bench/messages", replication=3, fragment=FragmentSpec(
            stores=(store,), compression_codec=Codec.NONE)))
        multi = [f"bench/many-{i}" for i in range(MULTI)]
        specs += [JournalSpec(name=n, replication=3, fragment=FragmentSpec(
            stores=(store,), compression_codec=Codec.NONE)) for n in multi]
        await client.apply(specs)
        for spec in specs:  # first append waits out the route's assignment
            await client.append(spec.name, b"", retry_timeout=60)
        for r in REPLICATION:
            for size in SIZES:
                for c in CONCURRENCY:
                    if r == 3:
                        res = await ref_case(ref, size, c, seconds=seconds)
                        _store_case(out, f"pipeline_r3_{size_name(size)}_c{c}", res)
                        say(f"pipeline R=3 {size_name(size)} x{c}: {res['mbps']:.1f} MB/s")
                    res = await append_case(client, f"bench/r{r}", size, c, seconds=seconds)
                    _store_case(out, f"quire_r{r}_{size_name(size)}_c{c}", res)
                    say(f"quire R={r} {size_name(size)} x{c}: {res['mbps']:.1f} MB/s")
                    if r == 3 and f"{size_name(size)}_c{c}" in FRESH_CASES:
                        res = await ref_case(ref, size, c, seconds=seconds, fresh=True)
                        _store_case(out, f"pipeline_fresh_r3_{size_name(size)}_c{c}", res)
                        say(f"pipeline (fresh pages) R=3 {size_name(size)} x{c}: "
                            f"{res['mbps']:.1f} MB/s")
        res = await ref_case(ref, 1 << 10, 64, seconds=seconds, journals=MULTI)
        _store_case(out, f"pipeline_{MULTI_CASE}", res)
        res = await append_case(client, multi, 1 << 10, 64, seconds=seconds)
        _store_case(out, f"quire_{MULTI_CASE}", res)
        say(f"quire R=3 1k x64 over {MULTI} journals: {res['ops_per_s']:.0f} appends/s")
        res = await message_rate(client, "bench/messages", seconds=msg_seconds, size=MESSAGE_SIZE)
        out["quire_appendservice_100b_r3_msgs"] = res["msgs_per_s"]
        out["quire_appendservice_100b_r3_mbps"] = res["mbps"]
        out["quire_appendservice_100b_r3_errors"] = res["errors"]
        out["quire_appendservice_100b_r3_p50_ms"] = res["p50_ms"]
        out["quire_appendservice_100b_r3_p99_ms"] = res["p99_ms"]
        say(f"AppendService: {res['msgs_per_s']:.0f} msgs/s")
    finally:
        await client.close()
    return out


def ratios(fig: dict[str, Any]) -> dict[str, float]:
    """quire / Redis (same size and concurrency), quire / SHA-1, quire / loopback, and
    quire R=3 / the minimal pipeline (ops, same case; and the c1 p99 latency ratio)."""
    out: dict[str, float] = {}

    def div(a: Any, b: Any) -> float | None:
        return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None

    for r in REPLICATION:
        for size in SIZES:
            for c in CONCURRENCY:
                key = f"quire_r{r}_{size_name(size)}_c{c}"
                peer = f"redis_{size_name(size)}_{'sync' if c == 1 else f'c{c}'}_ops"
                for name, value in (
                    ("vs_redis", div(fig.get(f"{key}_ops"), fig.get(peer))),
                    ("vs_sha1", div(fig.get(f"{key}_mbps"), fig.get("sha1_1m_mbps"))),
                    ("vs_loopback", div(fig.get(f"{key}_mbps"), fig.get("loopback_tcp_mbps"))),
                ):
                    if value is not None:
                        out[f"ratio_{key}_{name}"] = value
    for case in [f"r3_{size_name(size)}_c{c}" for size in SIZES for c in CONCURRENCY] + [MULTI_CASE]:
        v = div(fig.get(f"quire_{case}_ops"), fig.get(f"pipeline_{case}_ops"))
        if v is not None:
            out[f"ratio_quire_{case}_vs_pipeline"] = v
    for case in FRESH_CASES:
        v = div(fig.get(f"quire_r3_{case}_ops"), fig.get(f"pipeline_fresh_r3_{case}_ops"))
        if v is not None:
            out[f"ratio_quire_r3_{case}_vs_pipeline_fresh"] = v
    v = div(fig.get("quire_r3_1k_c1_p99_ms"), fig.get("pipeline_r3_1k_c1_p99_ms"))
    if v is not None:
        out["ratio_quire_r3_1k_c1_p99_vs_pipeline"] = v  # latency: lower is better
    v = div(fig.get("quire_appendservice_100b_r3_msgs"), fig.get("redis_100b_pipe_ops"))
    if v is not None:
        out["ratio_appendservice_vs_redis_pipe"] = v
    return out


def run_bench(quick: bool, workdir: Path, coordinators: int, console: Console) -> dict[str, Any]:
    say = (lambda msg: console.log(msg)) if console else (lambda msg: None)
    t0 = time.monotonic()
    fig: dict[str, Any] = {
        "quick": quick, "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "processor": _cpu_model()},
        "coordinators": coordinators, "loadavg_start": os.getloadavg()[0],
        "ktls": ktls_status().line(),
    }
    say(fig["ktls"])
    seconds = 1.5 if quick else 4.0
    say("limits: SHA-1, loopback TCP")
    fig.update(measure_limits(quick=quick))
    say("peer: redis-server XADD")
    fig.update(measure_redis((MESSAGE_SIZE, *SIZES), CONCURRENCY, seconds=1.0 if quick else 3.0,
                             progress=say))
    say(f"quire: starting {coordinators} coordinators and the reference R=3 pipeline")
    with LocalCluster(coordinators, zones=("zone-a", "zone-b"), workdir=workdir / "cluster") as cl, \
            PipelineRef() as ref:
        fig.update(asyncio.run(_quire(cl, ref, workdir, seconds, 3.0 if quick else 8.0, say)))
    say("quire: RSS of an idle coordinator")
    fig.update(measure_rss(workdir, settle=1.0 if quick else 3.0))
    fig.update(ratios(fig))
    fig["wall_seconds"] = time.monotonic() - t0
    fig["loadavg_end"] = os.getloadavg()[0]
    return fig


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _fmt(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def render(fig: dict[str, Any], console: Console) -> None:
    if fig.get("ktls"):
        console.print(fig["ktls"])
    t = Table(title="appends: quire vs Redis XADD (ops/s) and the machine's bounds (MB/s)")
    for col in ("R", "size", "conc", "ops/s", "MB/s", "p50 ms", "p99 ms", "redis ops/s",
                "quire/redis", "quire/SHA-1", "quire/loopback"):
        t.add_column(col, justify="right")
    for r in REPLICATION:
        for size in SIZES:
            for c in CONCURRENCY:
                k = f"quire_r{r}_{size_name(size)}_c{c}"
                peer = f"redis_{size_name(size)}_{'sync' if c == 1 else f'c{c}'}_ops"
                t.add_row(str(r), size_name(size), str(c), _fmt(fig.get(f"{k}_ops"), 0),
                          _fmt(fig.get(f"{k}_mbps")), _fmt(fig.get(f"{k}_p50_ms"), 2),
                          _fmt(fig.get(f"{k}_p99_ms"), 2), _fmt(fig.get(peer), 0),
                          _fmt(fig.get(f"ratio_{k}_vs_redis"), 2),
                          _fmt(fig.get(f"ratio_{k}_vs_sha1"), 3),
                          _fmt(fig.get(f"ratio_{k}_vs_loopback"), 3))
    console.print(t)
    p = Table(title="R=3 appends: quire vs the minimal pipeline (bench/pipeline_ref.py), same run")
    for col in ("case", "quire ops/s", "pipeline ops/s", "quire/pipeline", "quire p50 ms",
                "pipeline p50 ms", "quire p99 ms", "pipeline p99 ms"):
        p.add_column(col, justify="right")
    for case in [f"r3_{size_name(size)}_c{c}" for size in SIZES for c in CONCURRENCY] + [MULTI_CASE]:
        p.add_row(case, _fmt(fig.get(f"quire_{case}_ops"), 0), _fmt(fig.get(f"pipeline_{case}_ops"), 0),
                  _fmt(fig.get(f"ratio_quire_{case}_vs_pipeline"), 2),
                  _fmt(fig.get(f"quire_{case}_p50_ms"), 2), _fmt(fig.get(f"pipeline_{case}_p50_ms"), 2),
                  _fmt(fig.get(f"quire_{case}_p99_ms"), 2), _fmt(fig.get(f"pipeline_{case}_p99_ms"), 2))
    for case in FRESH_CASES:  # the reference writing fresh pages, as quire's spools do here
        p.add_row(f"r3_{case} (fresh pages)", _fmt(fig.get(f"quire_r3_{case}_ops"), 0),
                  _fmt(fig.get(f"pipeline_fresh_r3_{case}_ops"), 0),
                  _fmt(fig.get(f"ratio_quire_r3_{case}_vs_pipeline_fresh"), 2),
                  _fmt(fig.get(f"quire_r3_{case}_p50_ms"), 2),
                  _fmt(fig.get(f"pipeline_fresh_r3_{case}_p50_ms"), 2),
                  _fmt(fig.get(f"quire_r3_{case}_p99_ms"), 2),
                  _fmt(fig.get(f"pipeline_fresh_r3_{case}_p99_ms"), 2))
    console.print(p)
    m = Table(title="100-byte JSON messages (R=3 AppendService vs Redis XADD pipelined x100)")
    for col in ("quire msgs/s", "quire p50 ms", "quire p99 ms", "redis pipelined ops/s",
                "redis pipe p99 ms", "redis unpipelined ops/s", "quire/redis"):
        m.add_column(col, justify="right")
    m.add_row(_fmt(fig.get("quire_appendservice_100b_r3_msgs"), 0),
              _fmt(fig.get("quire_appendservice_100b_r3_p50_ms"), 2),
              _fmt(fig.get("quire_appendservice_100b_r3_p99_ms"), 2),
              _fmt(fig.get("redis_100b_pipe_ops"), 0), _fmt(fig.get("redis_100b_pipe_p99_ms"), 2),
              _fmt(fig.get("redis_100b_sync_ops"), 0),
              _fmt(fig.get("ratio_appendservice_vs_redis_pipe"), 2))
    console.print(m)
    lim = Table(title="limits (same run) and coordinator RSS")
    lim.add_column("figure")
    lim.add_column("value", justify="right")
    for k in ("sha1_1m_mbps", "sha1_64k_mbps", "sha1_1k_mbps", "loopback_tcp_mbps",
              "loopback_rtt_1k_x1_ops", "loopback_rtt_1k_x64_ops", "rss_0_journals_mb",
              "rss_1_journals_mb", "rss_100_journals_mb", "rss_1000_journals_mb"):
        lim.add_row(k, _fmt(fig.get(k)))
    console.print(lim)


def render_replicated(rep: dict[str, Any], console: Console) -> None:
    t = Table(title=f"R=3 against replicated peers, same run: median and spread over "
                    f"{rep['repeat']} repetition(s) (ratio > 1: quire faster)")
    for col in ("ratio", "median", "min", "max"):
        t.add_column(col, justify="right" if col != "ratio" else "left")
    for key, v in rep["summary"].items():
        if key.startswith("ratio_"):
            t.add_row(key[len("ratio_"):], _fmt(v["median"], 2), _fmt(v["min"], 2), _fmt(v["max"], 2))
    console.print(t)
    f = Table(title="figures (medians over the repetitions; latency: send to acknowledgement "
                    "at the client)")
    f.add_column("system · shape")
    for col in ("ops/s", "MB/s", "p50 ms", "p99 ms"):
        f.add_column(col, justify="right")
    for key, v in rep["summary"].items():
        if key.endswith("_ops") and not key.startswith("ratio_"):
            more = [rep["summary"].get(key[:-4] + suffix, {}).get("median")
                    for suffix in ("_mbps", "_p50_ms", "_p99_ms")]
            f.add_row(key[:-4], _fmt(v["median"], 0), _fmt(more[0]), _fmt(more[1], 2),
                      _fmt(more[2], 2))
    console.print(f)
    if rep.get("kafka_skipped"):
        console.print(rep["kafka_skipped"])


def render_secure(sec: dict[str, Any], console: Console) -> None:
    t = Table(title=f"--secure: quire R=3 (tokens + mTLS) vs NATS JetStream R=3 with TLS, same run; "
                    f"medians over {sec['repeat']} repetition(s) ({sec['ktls']})")
    for col in ("shape", "quire ops/s", "JetStream ops/s", "quire/JetStream", "min", "max",
                "quire p50 ms", "JetStream p50 ms", "quire p99 ms", "JetStream p99 ms"):
        t.add_column(col, justify="right")
    summ = sec["summary"]

    def med(key: str, what: str = "median") -> Any:
        return summ.get(key, {}).get(what)

    from .secure_peers import SECURE_SHAPES

    for size, conc in SECURE_SHAPES:
        case = f"{size_name(size)}_c{conc}"
        ratio = f"ratio_quire_tls_r3_{case}_vs_nats_tls"
        t.add_row(f"{size_name(size)} x{conc}", _fmt(med(f"quire_tls_{case}_ops"), 0),
                  _fmt(med(f"nats_tls_{case}_ops"), 0), _fmt(med(ratio), 2),
                  _fmt(med(ratio, "min"), 2), _fmt(med(ratio, "max"), 2),
                  _fmt(med(f"quire_tls_{case}_p50_ms"), 2), _fmt(med(f"nats_tls_{case}_p50_ms"), 2),
                  _fmt(med(f"quire_tls_{case}_p99_ms"), 2), _fmt(med(f"nats_tls_{case}_p99_ms"), 2))
    console.print(t)


def command(
    quick: bool = typer.Option(False, "--quick", help="Short cases (about two minutes, plus "
                               "about 40 s per repetition of the replicated peers)."),
    json_out: Path | None = typer.Option(None, "--json", help="Write every figure here."),
    coordinators: int = typer.Option(3, "--coordinators", min=3, max=5),
    repeat: int = typer.Option(1, "--repeat", min=1, max=50,
                               help="Repetitions of the comparison with the replicated peers "
                               "(NATS JetStream R=3, Redis + WAIT 2); medians and spreads."),
    peers: bool = typer.Option(True, "--peers/--no-peers",
                               help="Run the replicated peers (needs `make bench`)."),
    keep: bool = typer.Option(False, "--keep", help="Keep the work directory."),
    scale: bool = typer.Option(True, "--scale/--no-scale",
                               help="Run the scale section (bench/scale.py) at 10 and 1,000 "
                               "journals (10 and 100 with --quick)."),
    secure: bool = typer.Option(False, "--secure",
                                help="Also compare quire's secure path (tokens + mTLS, R=3) with "
                                "NATS JetStream R=3 with TLS (bench/secure_peers.py; needs "
                                "`make bench`), --repeat times."),
    log_level: str = typer.Option("WARNING", "--log-level"),
) -> None:
    """Benchmark quire against Redis Streams, replicated brokers (NATS JetStream R=3, Redis
    with two replicas) and the machine's SHA-1 / loopback limits."""
    configure_logging(format="console", level=log_level, stream=sys.stderr)
    interrupt_on_sigterm()  # `timeout 60 quire bench`: stop the cluster, remove the work dir
    console = Console(width=150)
    workdir = Path(tempfile.mkdtemp(prefix="quire-bench-"))
    try:
        fig = run_bench(quick, workdir, coordinators, console)
        if peers:
            console.log(f"replicated peers: {repeat} repetition(s)")
            fig["replicated"] = run_replicated(workdir / "replicated", repeat=repeat,
                                               seconds=1.0 if quick else 3.0,
                                               coordinators=coordinators,
                                               say=lambda m: console.log(m))
        if secure:
            from .secure_peers import run_secure

            console.log(f"secure: quire (tokens + mTLS) vs JetStream with TLS, {repeat} repetition(s)")
            fig["secure"] = run_secure(workdir / "secure", repeat=repeat,
                                       seconds=1.0 if quick else 3.0,
                                       say=lambda m: console.log(m))
        if scale:
            from .scale import run_scale

            sizes = [10, 100] if quick else [10, 1000]
            console.log(f"scale: {sizes} journals on 5 coordinators, R=3")
            fig["scale"] = run_scale(sizes, workdir / "scale", idle=10.0 if quick else 30.0,
                                     append_s=3.0 if quick else 10.0,
                                     say=lambda m: console.log(m))
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    render(fig, console)
    if "scale" in fig:
        from .scale import render as render_scale

        console.print("scale (bench/scale.py; docs/benchmarks.md, \"Scale\")")
        console.print(render_scale(fig["scale"]))
    if "replicated" in fig:
        render_replicated(fig["replicated"], console)
    if "secure" in fig:
        render_secure(fig["secure"], console)
    if json_out is not None:
        json_out.write_text(json.dumps(fig, indent=1, sort_keys=True))
        console.print(f"figures written to {json_out}")


def main() -> None:
    typer.run(command)


if __name__ == "__main__":
    main()
