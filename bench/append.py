"""R=3 append throughput through real coordinator processes on loopback.

    python -m bench.append [--seconds 5] [--json OUT]

Starts etcd and three coordinators (`python -m coordinator.main`), creates one journal
at replication 3 (codec none), and measures, against its primary:
  * 64 KiB appends, 16 connections each appending back to back  -> MB/s
  * 1 KiB appends, 64 connections each with one append in flight -> appends/s
  * the same, exactly-once identified (producer/generation/history/txn) vs plain, in
    alternating rounds on the same connections -> `ratio_identified_vs_plain_r3_1k_c64`
    (the cost of identification; goal >= 0.9)
Every process shares this machine's cores with the client. Rates on a shared 2-vCPU
box swing with the load, so each phase also reports the CPU time every process spent
per append (user + sys from /proc, µs): a figure that barely depends on the load.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import tempfile

from bench.common import (append_once, coordinator_argv, cpu_snapshot, drive, hello,
                          hello_when_up, stop_processes, write_json)
from protocol import (
    AppendResponse, ApplyChange, ApplyRequest,
    ApplyResponse, Codec, FragmentSpec, JournalSpec, ListRequest, ListResponse, Status,
)
from protocol.stream import FrameStream
from tools.lifetime import dying_with_us
from tools.services import EtcdService, free_port

JOURNAL = "bench/append"


async def _append(s: FrameStream, data: bytes) -> AppendResponse:
    return await append_once(s, JOURNAL, data)


async def _load(endpoint: str, size: int, conns: int, seconds: float) -> tuple[int, float]:
    streams = [await hello(endpoint) for _ in range(conns)]
    return await drive(streams, JOURNAL, os.urandom(size), seconds)


async def _run(args: argparse.Namespace, endpoints: list[str], pids: list[int]) -> dict:
    s = await hello_when_up(endpoints[0])
    spec = JournalSpec(name=JOURNAL, replication=3,
                       fragment=FragmentSpec(length=1 << 28, compression_codec=Codec.NONE))
    await s.send(ApplyRequest(changes=(ApplyChange(upsert=spec, expect_mod_revision=-1),)))
    await s.read_message(ApplyResponse)
    while True:  # wait for the route to form and the pipeline to sync
        try:
            r = await _append(s, b"")
            if r.status == Status.OK:
                break
        except Exception:  # noqa: BLE001 - answered early and closed: not ready yet
            pass
        await s.close()
        await asyncio.sleep(0.1)
        s = await hello(endpoints[0])
    await s.send(ListRequest())
    listing, _ = await s.read_message(ListResponse)
    await s.close()
    route = next(e.route for e in listing.journals if e.spec.name == JOURNAL)
    primary = endpoints[[f"node-{i}" for i in range(3)].index(route.members[route.primary].suffix)]
    suffix = route.members[route.primary].suffix
    roles = {"primary" if f"node-{i}" == suffix else f"replica-{i}": pid for i, pid in enumerate(pids)}

    async def phase(size: int, conns: int) -> dict:
        before = cpu_snapshot(roles)
        n, t = await _load(primary, size, conns, args.seconds)
        after = cpu_snapshot(roles)
        cpu = {k: round((after[k] - before[k]) / max(n, 1) * 1e6, 1) for k in after}
        cpu["total"] = round(sum(cpu.values()), 1)
        return {"append_bytes": size, "connections": conns, "appends": n, "seconds": round(t, 2),
                "appends_s": round(n / t), "mb_s": round(n * size / t / 1e6, 1),
                "cpu_us_per_append": cpu, "load_avg_1m": os.getloadavg()[0]}

    async def identified(rounds: int = 10) -> dict:
        """Plain and identified 1 KiB x 64 in alternating rounds (the load on a shared
        box drifts; alternating spreads the drift over both)."""
        streams = [await hello(primary) for _ in range(64)]
        data = os.urandom(1024)
        counts, times = {"plain": 0, "identified": 0}, {"plain": 0.0, "identified": 0.0}
        cpu = {"plain": 0.0, "identified": 0.0}
        by_role: dict[str, dict[str, float]] = {}
        for r in range(rounds * 2):
            kind = ("plain", "identified")[r % 2]
            before = cpu_snapshot(roles)
            n, t = await drive(streams, JOURNAL, data, args.seconds / rounds,
                               producer="bench" if kind == "identified" else "", close=False)
            after = cpu_snapshot(roles)
            cpu[kind] += sum(after[k] - before[k] for k in after)
            for k in after:
                by_role.setdefault(kind, {}).setdefault(k, 0.0)
                by_role[kind][k] += after[k] - before[k]
            counts[kind] += n
            times[kind] += t
        for s in streams:
            await s.close()
        rate = {k: counts[k] / times[k] for k in counts}
        return {"append_bytes": 1024, "connections": 64, "rounds": rounds,
                "plain_appends_s": round(rate["plain"]),
                "identified_appends_s": round(rate["identified"]),
                "ratio_identified_vs_plain_r3_1k_c64": round(rate["identified"] / rate["plain"], 3),
                # CPU of every process (client, primary, replicas) per append: barely
                # depends on the load, unlike the rates on a shared box.
                "cpu_us_per_append": {k: round(cpu[k] / max(counts[k], 1) * 1e6, 1) for k in cpu},
                "cpu_us_per_append_by_process": {
                    kind: {k: round(v / max(counts[kind], 1) * 1e6, 1) for k, v in roles_.items()}
                    for kind, roles_ in by_role.items()},
                "cpu_ratio_plain_vs_identified": round(
                    (cpu["plain"] / max(counts["plain"], 1))
                    / max(cpu["identified"] / max(counts["identified"], 1), 1e-9), 3),
                "load_avg_1m": os.getloadavg()[0]}

    await _load(primary, 64 << 10, 16, 1.0)  # warm up
    out: dict = {"benchmark": "append_r3"}
    if args.only in (None, "large"):
        out["large"] = await phase(64 << 10, 16)
    if args.only in (None, "small"):
        out["small"] = await phase(1024, 64)
    if args.only in (None, "identified"):
        out["identified"] = await identified()
        out["ratio_identified_vs_plain_r3_1k_c64"] = out["identified"][
            "ratio_identified_vs_plain_r3_1k_c64"]
    return out


def _uvloop_run(coro) -> dict:  # noqa: ANN001
    import uvloop

    return uvloop.run(coro)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.append")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("--only", choices=("large", "small", "identified"), help="run one phase only")
    ap.add_argument("--uvloop-client", action="store_true",
                    help="run the client on uvloop too (the coordinators always are)")
    args = ap.parse_args(argv)
    work = tempfile.mkdtemp(prefix="quire-bench-append-")
    procs: list[subprocess.Popen] = []
    try:
        with EtcdService("bench-etcd") as etcd:
            endpoints = []
            for i in range(3):
                port = free_port()
                endpoints.append(f"127.0.0.1:{port}")
                log = open(os.path.join(work, f"node-{i}.log"), "wb")
                procs.append(subprocess.Popen(
                    dying_with_us(coordinator_argv(
                        zone=f"z{i % 2}", suffix=f"node-{i}", listen=endpoints[-1],
                        etcd_url=etcd.url, root="/quire-bench",
                        spool_dir=os.path.join(work, f"spool-{i}"))),
                    stdout=log, stderr=subprocess.STDOUT))
            coro = _run(args, endpoints, [p.pid for p in procs])
            result = _uvloop_run(coro) if args.uvloop_client else asyncio.run(coro)
    finally:
        stop_processes(procs)
        shutil.rmtree(work, ignore_errors=True)
    if "large" in result:
        r = result["large"]
        print(f"64 KiB appends, R=3, 16 connections: {r['mb_s']} MB/s   "
              f"(CPU µs/append {r['cpu_us_per_append']}, load {r['load_avg_1m']:.1f})")
    if "small" in result:
        r = result["small"]
        print(f"1 KiB appends, R=3, 64 in flight:    {r['appends_s']} appends/s   "
              f"(CPU µs/append {r['cpu_us_per_append']}, load {r['load_avg_1m']:.1f})")
    if "identified" in result:
        r = result["identified"]
        print(f"1 KiB appends, R=3, 64 in flight, identified vs plain: "
              f"{r['identified_appends_s']} vs {r['plain_appends_s']} appends/s = "
              f"{r['ratio_identified_vs_plain_r3_1k_c64']}x   (CPU µs/append "
              f"{r['cpu_us_per_append']}, plain/identified {r['cpu_ratio_plain_vs_identified']}x, "
              f"load {r['load_avg_1m']:.1f})")
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
