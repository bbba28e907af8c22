"""quire against the replicated brokers a team would pick instead, in the same run.

    quire bench --quick --repeat 5

Beside a 3-coordinator quire cluster (R=3) and the minimal R=3 pipeline
(bench/pipeline_ref.py) this starts NATS JetStream (three `nats-server`, a stream of
three file-store replicas: bench/peer_nats.py) and Redis with two replicas and `WAIT 2 0`
after each XADD (bench/peer_redis_wait.py). Kafka (three KRaft brokers, `acks=all`) cannot
run here: no registry this machine reaches (PyPI, Debian, npm) ships a Kafka broker, and
the Maven registry is not reachable; the bench says so in one line and goes on.

Every repetition runs every shape on every system, the systems of a shape back to back
in an order that rotates from one repetition to the next (so no system always runs
first, on a cooler machine); a ratio is computed inside one repetition, between runs
seconds apart, and the report gives each ratio's median and its spread over the
repetitions. Shapes (bench/closed_loop.py): one operation in flight per connection at
1 KiB ×1, 1 KiB ×64, 64 KiB ×8, 1 MiB ×8 (and quire's 8-journal case against the
pipeline's); batched: 100-byte messages as each system's users batch them
(AppendService; JetStream publishes with up to 1,000 acknowledgements outstanding; a
Redis pipeline of 100 XADDs and one WAIT) — and the single Redis of `quire bench`'s
matrix with redis-py's pipelines of 100 XADDs, the reference of the AppendService goal,
so that ratio too is a median over alternated repetitions.
"""

from __future__ import annotations

import asyncio
import os
import statistics
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from chaos.cluster import LocalCluster
from protocol import Codec, FragmentSpec, JournalSpec
from quire.client import Client

from .matrix import append_case, message_rate
from .peer_nats import NatsCluster, NatsDriver
from .peer_redis_wait import RedisReplicas, RedisWaitDriver
from .peers import BenchRedis, size_name, xadd_pipelined
from .pipeline_ref import PipelineRef, ref_case

__all__ = ["SHAPES", "kafka_unavailable", "run_replicated", "summarize"]

SHAPES = ((1 << 10, 1), (1 << 10, 64), (64 << 10, 8), (1 << 20, 8))
FRESH = ((64 << 10, 8), (1 << 20, 8))
"""Shapes also run on the pipeline writing fresh pages: a log never rewrites a warm
window, so that is the honest reference for big appends (docs/benchmarks.md)."""
MULTI = 8
BATCH_SIZE = 100


def kafka_unavailable() -> str:
    """Why Kafka is not in the run, in one line."""
    return ("Kafka: not run — no Kafka broker is installable on this machine (its registries are "
            "PyPI, Debian and npm, none of which ships one; the Maven registry is not reachable)")


def _case(size: int, conc: int) -> str:
    return f"{size_name(size)}_c{conc}"


async def _repetition(rep: int, client: Client, ref: PipelineRef, nats: NatsDriver,
                      redis_wait: RedisWaitDriver, redis_pipe: Any, multi: list[str],
                      seconds: float, say: Callable[[str], None]) -> dict[str, float]:
    """One pass over every shape and system; returns the figures of this pass."""
    fig: dict[str, float] = {}
    for size, conc in SHAPES:
        case = _case(size, conc)
        runs: list[tuple[str, Callable[[], Awaitable[dict[str, Any]]]]] = [
            ("quire", lambda: append_case(client, "bench/r3", size, conc, seconds=seconds)),
            ("pipeline", lambda: ref_case(ref, size, conc, seconds=seconds)),
            ("nats", lambda: nats.one_in_flight(size, conc, seconds)),
            ("redis_wait", lambda: redis_wait.one_in_flight(size, conc, seconds)),
        ]
        if (size, conc) in FRESH:
            runs.append(("pipeline_fresh",
                         lambda: ref_case(ref, size, conc, seconds=seconds, fresh=True)))
        k = rep % len(runs)
        for name, run in runs[k:] + runs[:k]:
            res = await run()
            fig[f"{name}_{case}_ops"] = res["ops_per_s"]
            fig[f"{name}_{case}_mbps"] = res["mbps"]
            _latency(fig, f"{name}_{case}", res)
            if res.get("errors"):
                fig[f"{name}_{case}_errors"] = res["errors"]
        say(f"rep {rep + 1} {case}: quire {fig[f'quire_{case}_ops']:,.0f}/s, "
            f"NATS {fig[f'nats_{case}_ops']:,.0f}/s, Redis+WAIT {fig[f'redis_wait_{case}_ops']:,.0f}/s, "
            f"pipeline {fig[f'pipeline_{case}_ops']:,.0f}/s")
    case = f"1k_c64_j{MULTI}"
    multi_runs = [
        ("quire", lambda: append_case(client, multi, 1 << 10, 64, seconds=seconds)),
        ("pipeline", lambda: ref_case(ref, 1 << 10, 64, seconds=seconds, journals=MULTI)),
    ]
    for name, run in multi_runs[rep % 2:] + multi_runs[:rep % 2]:
        res = await run()
        fig[f"{name}_{case}_ops"] = res["ops_per_s"]
        _latency(fig, f"{name}_{case}", res)
    batched = [
        ("quire", lambda: message_rate(client, "bench/messages", seconds=seconds, size=BATCH_SIZE)),
        ("nats", lambda: nats.batched(BATCH_SIZE, 1000, seconds)),
        ("redis_wait", lambda: redis_wait.batched(BATCH_SIZE, 100, seconds)),
        # The single Redis of the matrix, redis-py's blocking pipelines of 100 XADDs (no
        # WAIT): the reference of the AppendService goal, alternated like the rest.
        ("redis_pipe", lambda: asyncio.to_thread(xadd_pipelined, redis_pipe, BATCH_SIZE,
                                                 seconds=seconds)),
    ]
    k = rep % len(batched)
    for name, run in batched[k:] + batched[:k]:
        res = await run()
        fig[f"{name}_batched_100b_ops"] = res.get("msgs_per_s", res.get("ops_per_s", 0.0))
        _latency(fig, f"{name}_batched_100b", res)
    say(f"rep {rep + 1} batched 100 B: quire {fig['quire_batched_100b_ops']:,.0f}/s, "
        f"NATS {fig['nats_batched_100b_ops']:,.0f}/s, Redis+WAIT {fig['redis_wait_batched_100b_ops']:,.0f}/s, "
        f"Redis pipelined {fig['redis_pipe_batched_100b_ops']:,.0f}/s")
    return fig


def _latency(fig: dict[str, float], key: str, res: dict[str, Any]) -> None:
    """`<key>_p50_ms`, `<key>_p99_ms`: client-side, send to acknowledgement (bench/latency.py)."""
    for q in ("p50_ms", "p99_ms"):
        v = res.get(q)
        if isinstance(v, float) and v == v:  # NaN: no acknowledged operation
            fig[f"{key}_{q}"] = v


def ratios(fig: dict[str, float]) -> dict[str, float]:
    """The ratios of one repetition: quire over each peer, same shape."""
    out: dict[str, float] = {}

    def put(key: str, a: str, b: str) -> None:
        if fig.get(b):
            out[key] = fig.get(a, 0.0) / fig[b]

    for size, conc in SHAPES:
        case = _case(size, conc)
        for peer in ("nats", "redis_wait", "pipeline"):
            put(f"ratio_quire_r3_{case}_vs_{peer}", f"quire_{case}_ops", f"{peer}_{case}_ops")
        if (size, conc) in FRESH:
            put(f"ratio_quire_r3_{case}_vs_pipeline_fresh", f"quire_{case}_ops",
                f"pipeline_fresh_{case}_ops")
    case = f"1k_c64_j{MULTI}"
    put(f"ratio_quire_r3_{case}_vs_pipeline", f"quire_{case}_ops", f"pipeline_{case}_ops")
    for peer in ("nats", "redis_wait", "redis_pipe"):
        put(f"ratio_quire_batched_100b_vs_{peer}", "quire_batched_100b_ops",
            f"{peer}_batched_100b_ops")
    return out


def summarize(reps: list[dict[str, float]]) -> dict[str, Any]:
    """Per key over the repetitions: the median and the spread (min, max)."""
    keys = sorted({k for r in reps for k in r})
    out: dict[str, Any] = {}
    for k in keys:
        values = [r[k] for r in reps if k in r]
        out[k] = {"median": statistics.median(values), "min": min(values), "max": max(values),
                  "n": len(values)}
    return out


async def _run(cluster: LocalCluster, ref: PipelineRef, nats_urls: list[str],
               redis: RedisReplicas, redis_pipe: Any, workdir: Path, repeat: int, seconds: float,
               say: Callable[[str], None]) -> list[dict[str, float]]:
    store = (workdir / "store").as_uri() + "/"
    (workdir / "store").mkdir(parents=True, exist_ok=True)
    client = Client(cluster.endpoints, retry_timeout=30)
    multi = [f"bench/many-{i}" for i in range(MULTI)]
    frag = FragmentSpec(stores=(store,), compression_codec=Codec.NONE)
    reps: list[dict[str, float]] = []
    try:
        specs = [JournalSpec(name=n, replication=3, fragment=frag)
                 for n in ("bench/r3", "bench/messages", *multi)]
        await client.apply(specs)
        for spec in specs:  # the first append waits out the route's assignment
            await client.append(spec.name, b"", retry_timeout=60)
        async with NatsDriver(nats_urls) as nats, RedisWaitDriver(redis) as redis_wait:
            for rep in range(repeat):
                fig = await _repetition(rep, client, ref, nats, redis_wait, redis_pipe, multi,
                                        seconds, say)
                fig.update(ratios(fig))
                reps.append(fig)
    finally:
        await client.close()
    return reps


def run_replicated(workdir: Path, *, repeat: int, seconds: float, coordinators: int = 3,
                   say: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Start every system, run `repeat` repetitions, stop everything."""
    out: dict[str, Any] = {"repeat": repeat, "seconds_per_case": seconds,
                           "loadavg_start": os.getloadavg()[0]}
    out["kafka_skipped"] = kafka_unavailable()
    say(out["kafka_skipped"])
    with LocalCluster(coordinators, zones=("zone-a", "zone-b"), workdir=workdir / "cluster") as cl, \
            PipelineRef() as ref, NatsCluster(workdir / "nats") as nats, \
            RedisReplicas(workdir / "redis") as redis, BenchRedis() as single, \
            single.client() as redis_pipe:
        reps = asyncio.run(_run(cl, ref, nats.urls, redis, redis_pipe, workdir, repeat, seconds,
                                say))
    out["repetitions"] = reps
    out["summary"] = summarize(reps)
    out["loadavg_end"] = os.getloadavg()[0]
    return out
