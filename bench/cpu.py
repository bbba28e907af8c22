"""CPU per append of every process, quire R=3 beside the minimal pipeline, one run.

    python -m bench.cpu [--size 1024] [--conc 64] [--seconds 5] [--rounds 2] [--json OUT]

The case of `quire bench` (`Client.append` from `conc` tasks of this process, one append
in flight each, to one R=3 journal of a 3-coordinator cluster on loopback) and the same
case on the reference (bench/pipeline_ref.py), in alternating rounds: appends/s and the
user + sys CPU time each process spent per append (µs, from /proc; `sys_us_per_append`:
the system part alone; `minor_faults_per_append`: page faults, e.g. of fresh heap), for quire's primary, its two replicas and the client, and the
reference's primary, replicas and client. On a
shared 2-vCPU machine the rates swing with other work; the CPU per append moves much
less, so it is the figure to compare versions by (run both back to back, alternating).
`--profile DIR`: py-spy (raw, 250 Hz) of quire's primary, one replica (one journal) and
the client in the last round (DIR/primary.txt, replica.txt, client.txt).
`--journals N`: the many-journal case of `quire bench` (task i appends to journal i mod N,
primaries spread over the three coordinators; the reference spreads its N the same way);
every coordinator is then a primary, so processes are named by their suffix and the
journals they lead (`coord-<suffix>-p<k>`), and `--profile` records the busiest one.
`--fresh`: the reference's spool files never wrap, so it writes fresh pages as quire's
spools do in the bench (the honest reference for big appends: docs/benchmarks.md).
`--perf DIR`: perf record (499 Hz) of every coordinator in the last round, DIR/<name>.data,
and of the reference's processes, DIR/ref-<name>.data (QUIRE_BENCH_STRACE=1: `strace -c`
counts instead, DIR/<name>.strace).
(`perf report -i DIR/primary.data`: compiled frames show as C symbols).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from chaos.cluster import LocalCluster
from tools.lifetime import dying_with_us
from protocol import Codec, FragmentSpec, JournalSpec
from quire.client import Client

from .common import write_json
from .matrix import append_case
from .pipeline_ref import FRESH, PipelineRef, ref_case

JOURNAL = "bench/cpu"


def _cpu(pid: int) -> tuple[float, float, int]:
    """(user, sys) CPU seconds of a process so far, and its minor page faults (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick, int(fields[7])


def _snapshot(pids: dict[str, int]) -> dict[str, tuple[float, float, int]]:
    out = {name: _cpu(pid) for name, pid in pids.items()}
    t = os.times()
    out["client"] = (t.user, t.system, _cpu(os.getpid())[2])
    return out


async def _measure(pids: dict[str, int], run: Any) -> dict[str, Any]:
    before = _snapshot(pids)
    res = await run()
    after = _snapshot(pids)
    n = max(res["n"], 1)
    cpu = {k: round((after[k][0] + after[k][1] - before[k][0] - before[k][1]) / n * 1e6, 1)
           for k in after}
    cpu["total"] = round(sum(cpu.values()), 1)
    system = {k: round((after[k][1] - before[k][1]) / n * 1e6, 1) for k in after}
    faults = {k: round((after[k][2] - before[k][2]) / n, 1) for k in after}
    return {"ops_per_s": round(res["ops_per_s"], 1), "cpu_us_per_append": cpu,
            "sys_us_per_append": system, "minor_faults_per_append": faults,
            "load_avg_1m": os.getloadavg()[0]}


def _perf(pid: int, out: Path, seconds: float) -> subprocess.Popen:
    """perf record of `pid` (py-spy cannot see compiled frames: docs/compiled.md)."""
    if os.environ.get("QUIRE_BENCH_STRACE"):  # system calls counted instead (strace -c)
        cmd = ["timeout", "-s", "INT", str(max(1, int(seconds))), "strace", "-c", "-f",
               "-p", str(pid), "-o", str(out.with_suffix(".strace"))]
    else:
        cmd = ["perf", "record", "-g", "-F", "499", "-p", str(pid), "-o", str(out), "--", "sleep",
               str(max(1, int(seconds)))]
    if shutil.which(cmd[0]) is None:
        raise SystemExit(f"--perf needs {cmd[0]} on PATH")
    return subprocess.Popen(dying_with_us(cmd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _spy(pid: int, out: Path, seconds: float) -> subprocess.Popen:
    exe = Path(sys.executable).with_name("py-spy")
    found = str(exe) if exe.exists() else shutil.which("py-spy")
    if found is None:
        raise SystemExit("--profile needs py-spy (pip install py-spy) beside python or on PATH")
    return subprocess.Popen(dying_with_us([found, "record", "--pid", str(pid),
                                           "-r", "250", "-d", str(max(1, int(seconds))),
                                           "-f", "raw", "-o", str(out), "--nonblocking"]),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def _run(args: argparse.Namespace, cluster: LocalCluster, ref: PipelineRef) -> dict[str, Any]:
    client = Client(cluster.endpoints, retry_timeout=30)
    try:
        n = args.journals
        names = [JOURNAL] if n <= 1 else [f"{JOURNAL}-{i}" for i in range(n)]
        await client.apply([JournalSpec(name=j, replication=3, fragment=FragmentSpec(
            compression_codec=Codec.NONE)) for j in names])
        leads: dict[str, int] = {}
        for j in names:
            await client.append(j, b"", retry_timeout=60)
            entry = await client.get_journal(j)
            suffix = entry.route.members[entry.route.primary].suffix
            leads[suffix] = leads.get(suffix, 0) + 1
        if n <= 1:
            quire_pids = {("primary" if c.suffix in leads else f"replica-{c.suffix}"): c.pid
                          for c in cluster.coordinators if c.pid is not None}
        else:
            quire_pids = {f"coord-{c.suffix}-p{leads.get(c.suffix, 0)}": c.pid
                          for c in cluster.coordinators if c.pid is not None}
        busiest = max(quire_pids, key=lambda k: (k == "primary", k.rpartition("-p")[2]))
        target: Any = JOURNAL if n <= 1 else names
        # The reference's process i leads the journals j with j % 3 == i (PipelineRef.endpoint);
        # its fresh-page journal 0 is 0 | FRESH.
        lead = (FRESH if args.fresh else 0) % 3
        ref_pids = {("primary" if i == lead else f"replica-{i}"): p.pid
                    for i, p in enumerate(ref._procs)}  # noqa: SLF001
        size, conc, secs = args.size, args.conc, args.seconds
        await append_case(client, target, size, conc, seconds=1.0)  # warm up
        await ref_case(ref, size, conc, seconds=1.0, journals=max(n, 1), fresh=args.fresh)
        rounds: list[dict[str, Any]] = []
        for r in range(args.rounds):
            spies = []
            if args.profile and r == args.rounds - 1:
                Path(args.profile).mkdir(parents=True, exist_ok=True)
                spies = [_spy(quire_pids[busiest], Path(args.profile) / "primary.txt", secs),
                         _spy(os.getpid(), Path(args.profile) / "client.txt", secs)]
                replica = next((k for k in sorted(quire_pids) if k.startswith("replica-")), None)
                if replica is not None:  # (one journal: the replicas are not primaries)
                    spies.append(_spy(quire_pids[replica], Path(args.profile) / "replica.txt", secs))
                await asyncio.sleep(1.0)  # py-spy attaches
            if args.perf and r == args.rounds - 1:
                Path(args.perf).mkdir(parents=True, exist_ok=True)
                spies = [_perf(pid, Path(args.perf) / f"{name}.data", secs)
                         for name, pid in quire_pids.items()]
            q = await _measure(quire_pids, lambda: append_case(client, target, size, conc, seconds=secs))
            for p in spies:
                p.wait()
            if args.perf and r == args.rounds - 1:  # the reference's processes too
                spies = [_perf(pid, Path(args.perf) / f"ref-{name}.data", secs)
                         for name, pid in ref_pids.items()]
            p_ = await _measure(ref_pids, lambda: ref_case(ref, size, conc, seconds=secs,
                                                              journals=max(n, 1), fresh=args.fresh))
            for p in spies:
                p.wait()
            q["ratio_vs_pipeline"] = round(q["ops_per_s"] / p_["ops_per_s"], 3) if p_["ops_per_s"] else None
            rounds.append({"quire": q, "pipeline": p_})
            print(f"round {r + 1}: quire {q['ops_per_s']:,.0f}/s cpu {q['cpu_us_per_append']} "
                  f"(sys {q['sys_us_per_append']}; faults {q['minor_faults_per_append']})  |  pipeline {p_['ops_per_s']:,.0f}/s cpu "
                  f"{p_['cpu_us_per_append']} (sys {p_['sys_us_per_append']}; faults "
                  f"{p_['minor_faults_per_append']})  |  "
                  f"ratio {q['ratio_vs_pipeline']}  load {q['load_avg_1m']:.1f}", flush=True)
        return {"size": size, "concurrency": conc, "journals": max(n, 1), "seconds": secs,
                "rounds": rounds}
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cpu")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--conc", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--journals", type=int, default=1)
    ap.add_argument("--profile", metavar="DIR")
    ap.add_argument("--perf", metavar="DIR",
                    help="perf record every quire coordinator in the last round (DIR/<name>.data)")
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("--fresh", action="store_true",
                    help="the reference writes fresh pages, as quire's spools do here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="quire-bench-cpu-") as work:
        with LocalCluster(3, workdir=Path(work) / "cluster") as cluster, PipelineRef() as ref:
            result = asyncio.run(_run(args, cluster, ref))
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
