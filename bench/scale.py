"""What a journal costs as journals number in the thousands (issue #49, DESIGN §16).

    python -m bench.scale --journals 10 1000 10000 [--json OUT]

For each N, a fresh cluster (bench/scale_cluster.py: etcd, Redis, 5 coordinators with
`--journal-limit` raised as an operator would, a Celery worker and beat), then:

1. the empty coordinators' RSS and fds (the baseline of "per hosted replica");
2. N journals (R=3) applied in chunks of APPLY_CHUNK specs per `Client.apply` (an etcd
   transaction holds at most 128 operations: until `quire journals apply` splits large
   changes itself, the bench does) -- `apply_s`;
3. `full_s`: seconds after the apply until every route is full (R assignments, a
   primary, and the route advertised in every assignment: the primary synchronized it);
4. `settle` seconds, then IDLE for `idle` seconds: each coordinator's CPU (% of a core,
   /proc/PID/stat), then its RSS, open fds, threads, asyncio tasks and replicas (its
   /metrics), etcd's key count and db size;
5. appends/s of 1 KiB appends from 64 tasks, each taking the next journal round-robin
   over all N: first one append to each journal (its first fragment opens; timed apart),
   then for `append` seconds — with the lane's appends per commit and the CPU per
   append of the client, the coordinators and the rest over that window (bench/scale_appends.py);
6. the cluster is stopped (`stop_s`).

Rates are also given as a ratio to the N = 10 run (the first N) of the same run;
per-replica costs are (figure - empty coordinator's) / replicas hosted. Every wait is
bounded, and every process started is stopped, on Ctrl-C and SIGTERM too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import msgspec

from protocol import Codec, FragmentSpec, JournalSpec, LabelSet, Route
from quire.client import Client
from topology.etcd import parse_assignment_key

from . import scale_failover
from .scale_appends import Window, appends, round_robin
from .scale_cluster import (
    OTHERS, ROOT, CpuMeter, ScaleCluster, etcd_assignments, etcd_status, proc_stats, raise_nofile,
)

__all__ = ["APPLY_CHUNK", "GOALS", "assigned_journals", "derive", "full_routes", "journal_limit", "main",
           "round_robin", "run_scale"]

APPLY_CHUNK = 100
"""Specs per apply (one etcd transaction; etcd's default limit is 128 operations)."""
APPLY_ATTEMPTS = 3
REPLICATION = 3
COORDINATORS = 5
GOALS = {"full_s": 60.0, "idle_cpu_pct": 5.0, "rss_kib_per_replica": 64.0,
         "fds_per_replica": 0.25, "append_ratio": 0.8}
"""Issue #49's figures at 10,000 journals (docs/benchmarks.md, "Scale")."""


def journal_limit(journals: int, replication: int, coordinators: int) -> int:
    """The `--journal-limit` an operator would give: twice the even share, room to spare
    for one member's failover (and never below the default of 1024)."""
    share = -(-journals * replication // coordinators)
    return max(1024, 2 * share + 64)


def assigned_journals(assignments: Iterable[tuple[str, bytes]], replication: int,
                      root: str = ROOT) -> set[str]:
    """Journals the allocator has finished with: `replication` assignments, a primary
    (whether or not the route is advertised yet)."""
    slots: dict[str, list[int]] = {}
    for key, _ in assignments:
        try:
            journal, _, slot = parse_assignment_key(root, key)
        except ValueError:
            continue
        slots.setdefault(journal, []).append(slot)
    return {j for j, s in slots.items() if len(s) == replication and 0 in s}


def full_routes(assignments: Iterable[tuple[str, bytes]], replication: int,
                root: str = ROOT) -> set[str]:
    """Journals whose route is full: `replication` assignments, one of them the primary
    (slot 0), and every assignment holding the route they make (advertised by a pulse)."""
    by_journal: dict[str, list[tuple[Any, int, bytes]]] = {}
    for key, value in assignments:
        try:
            journal, member, slot = parse_assignment_key(root, key)
        except ValueError:
            continue
        by_journal.setdefault(journal, []).append((member, slot, value))
    out: set[str] = set()
    for journal, items in by_journal.items():
        members = tuple(sorted({m for m, _, _ in items}))
        primaries = sorted(m for m, slot, _ in items if slot == 0)
        if len(members) != replication or len(items) != replication or not primaries:
            continue
        route = Route(members=members, primary=members.index(primaries[0]))
        try:
            values = [msgspec.json.decode(v, type=Route) for _, _, v in items]
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        if all(v.equivalent(route) for v in values):
            out.add(journal)
    return out


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def derive(run: dict[str, Any], base: dict[str, Any] | None) -> dict[str, Any]:
    """Per-replica costs over the empty coordinators and the ratios to the base run."""
    out: dict[str, Any] = {}
    per_rss, per_fds = [], []
    for c, empty in zip(run.get("coordinators", []), run.get("empty", [])):
        n = c.get("replicas") or 0
        if n > 0 and "rss_kib" in c and "rss_kib" in empty:
            per_rss.append((c["rss_kib"] - empty["rss_kib"]) / n)
            per_fds.append((c["fds"] - empty["fds"]) / n)
    out["rss_kib_per_replica"] = max(per_rss) if per_rss else None
    out["fds_per_replica"] = max(per_fds) if per_fds else None
    cpus = [c["idle_cpu_pct"] for c in run.get("coordinators", []) if "idle_cpu_pct" in c]
    out["idle_cpu_pct_max"] = max(cpus) if cpus else None
    out["idle_cpu_pct_median"] = _median(cpus)
    if base is not None and base.get("appends_per_s") and run.get("appends_per_s") is not None:
        out["append_ratio"] = run["appends_per_s"] / base["appends_per_s"]
    return out


def _labels() -> LabelSet:
    return LabelSet.of(bench="scale")


async def _apply(client: Client, names: list[str], store: str) -> int:
    """Upsert every spec, APPLY_CHUNK per transaction; a chunk that fails is applied again
    (an unconditional upsert of the same specs: idempotent), at most APPLY_ATTEMPTS
    times. Returns how many chunks had to be re-sent."""
    resent = 0
    for k in range(0, len(names), APPLY_CHUNK):
        specs = [JournalSpec(name=n, replication=REPLICATION, labels=_labels(),
                             fragment=FragmentSpec(stores=(store,), compression_codec=Codec.NONE))
                 for n in names[k:k + APPLY_CHUNK]]
        for attempt in range(APPLY_ATTEMPTS):
            try:
                await client.apply(specs)
                break
            except Exception:  # noqa: BLE001 - e.g. UNAVAILABLE from an overloaded member
                if attempt == APPLY_ATTEMPTS - 1:
                    raise
                resent += 1
                await asyncio.sleep(1.0)  # backoff before the same chunk again
    return resent


async def _wait_full(cluster: ScaleCluster, names: list[str], timeout: float,
                     say: Callable[[str], None], run: dict[str, Any]) -> tuple[float | None, int]:
    """Seconds until every route of `names` is full (None past `timeout`) and how many
    are; records in `run` when every journal was assigned (`assigned_s`: the allocator's
    part) and how many were full at each poll (`full_curve`: [s, full])."""
    t0 = time.monotonic()
    want = set(names)
    full = 0
    last_say = t0
    run["assigned_s"] = None
    run["full_curve"] = curve = []
    while time.monotonic() - t0 < timeout:
        got = await asyncio.to_thread(etcd_assignments, cluster.etcd_url)
        now = time.monotonic() - t0
        if run["assigned_s"] is None and want <= assigned_journals(got, REPLICATION):
            run["assigned_s"] = now
        full = len(want & full_routes(got, REPLICATION))
        curve.append([round(now, 1), full])
        if full == len(want):
            return now, full
        if time.monotonic() - last_say > 15:
            say(f"  {full}/{len(want)} routes full after {now:.0f} s"
                f" (assigned: {run['assigned_s']})")
            last_say = time.monotonic()
        await asyncio.sleep(1.0)  # poll: the allocator and pulses work in batches
    return None, full


def _sample(cluster: ScaleCluster) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, svc in enumerate(cluster.coordinators):
        if not svc.running:  # died: say how, with its last words
            out.append({"exited": svc.returncode, "log_tail": svc.log_tail(20)})
            continue
        st: dict[str, Any] = dict(proc_stats(svc.pid))
        try:
            m = cluster.metrics(i)
            st.update({name: int(m[k]) for name, k in (("tasks", "quire_asyncio_tasks"),
                                                       ("replicas", "quire_replicas")) if k in m})
        except OSError:
            pass
        out.append(st)
    return out


async def _one(n: int, workdir: Path, *, settle: float, idle: float, append_s: float,
               say: Callable[[str], None], failover: bool = False,
               lease_ttl: float = 20.0) -> dict[str, Any]:
    run: dict[str, Any] = {"journals": n, "loadavg_start": os.getloadavg()}
    limit = journal_limit(n, REPLICATION, COORDINATORS)
    cluster = ScaleCluster(workdir, coordinators=COORDINATORS, journal_limit=limit,
                           lease_ttl=lease_ttl)
    try:
        t0 = time.monotonic()
        cluster.start()
        run["start_s"] = time.monotonic() - t0
        await asyncio.sleep(min(settle, 5.0))
        run["empty"] = _sample(cluster)
        names = [f"scale/j-{i:05d}" for i in range(n)]
        client = Client(cluster.endpoints, retry_timeout=60)
        try:
            t0 = time.monotonic()
            run["apply_resent_chunks"] = await _apply(client, names, cluster.store)
            run["apply_s"] = time.monotonic() - t0
        finally:
            await client.close()
        say(f"N={n}: applied in {run['apply_s']:.1f} s")
        run["full_s"], run["full_routes"] = await _wait_full(
            cluster, names, timeout=120 + 0.1 * n, say=say, run=run)
        say(f"N={n}: routes full after {run['full_s']} s ({run['full_routes']}/{n}); "
            f"every journal assigned after {run['assigned_s']} s")
        await asyncio.sleep(settle)
        meter = CpuMeter(cluster)
        await asyncio.sleep(idle)
        span, used = meter.span(), meter.used()
        cpu = [100 * v / span for k, v in used.items() if k.startswith("coordinator ")]
        run["coordinators"] = _sample(cluster)
        for st, pct in zip(run["coordinators"], cpu):
            st["idle_cpu_pct"] = pct
        run["others"] = {k: {**proc_stats(p), "idle_cpu_pct": 100 * used[k] / span}
                         for k, p in meter.pids.items() if k in OTHERS}
        run.update(await asyncio.to_thread(etcd_status, cluster.etcd_url))
        say(f"N={n}: idle CPU {[round(c, 1) for c in cpu]} % of a core")
        run.update(await appends(cluster.endpoints, names, append_s,
                                 window=lambda: Window(cluster)))
        say(f"N={n}: first append to each journal {run['first_appends_per_s']:.0f}/s; then "
            f"{run['appends_per_s']:.0f} appends/s round-robin "
            f"({run['append_errors']} errors); {run['appends_per_commit']} appends per "
            f"commit, CPU per append {run['append_cpu_us']} µs")
        if failover:
            run["failover"] = await scale_failover.failover(
                cluster, names, full_routes, REPLICATION, timeout=120 + 0.05 * n, say=say)
    except Exception as exc:  # noqa: BLE001 - reported with what was measured, then stopped
        run["error"] = repr(exc)
        say(f"N={n}: failed: {exc!r}")
    finally:
        run["errors_logged"] = await asyncio.to_thread(cluster.errors_logged)
        run["stop_s"] = cluster.stop()
        run["loadavg_end"] = os.getloadavg()
    return run


def run_scale(sizes: list[int], workdir: Path, *, settle: float = 10.0, idle: float = 30.0,
              append_s: float = 10.0, say: Callable[[str], None] = print,
              failover: bool = False, lease_ttl: float = 20.0) -> dict[str, Any]:
    soft, hard = raise_nofile()
    out: dict[str, Any] = {"benchmark": "scale", "coordinators": COORDINATORS,
                           "replication": REPLICATION, "nofile": [soft, hard],
                           "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "idle_s": idle, "append_s": append_s, "runs": []}
    base = None
    for n in sizes:
        run = asyncio.run(_one(n, workdir / f"n{n}", settle=settle, idle=idle,
                               append_s=append_s, say=say, failover=failover,
                               lease_ttl=lease_ttl))
        run.update(derive(run, base))
        base = base or (run if run.get("appends_per_s") else None)
        out["runs"].append(run)
        shutil.rmtree(workdir / f"n{n}", ignore_errors=True)
    return out


def render(result: dict[str, Any]) -> str:
    cols = ("N", "apply s", "assigned s", "full s", "RSS MiB (max)", "KiB/replica", "fds (max)", "fds/replica",
            "tasks (max)", "idle CPU % (max)", "etcd keys", "etcd MB", "appends/s", "x N=10",
            "appends/commit", "CPU µs/append", "stop s")
    rows = [cols]

    def f(v: Any, d: int = 1) -> str:
        return "-" if v is None else (f"{v:,.{d}f}" if isinstance(v, float) else str(v))

    for r in result["runs"]:
        cs = [c for c in r.get("coordinators", []) if "rss_kib" in c]
        rows.append((str(r["journals"]), f(r.get("apply_s")), f(r.get("assigned_s")),
                     f(r.get("full_s")),
                     f(max((c["rss_kib"] for c in cs), default=None) / 1024 if cs else None),
                     f(r.get("rss_kib_per_replica")),
                     f(max((c["fds"] for c in cs), default=None)), f(r.get("fds_per_replica"), 2),
                     f(max((c["tasks"] for c in cs if "tasks" in c), default=None)),
                     f(r.get("idle_cpu_pct_max")), f(r.get("etcd_keys")),
                     f(r.get("etcd_db_bytes", 0) / 1e6), f(r.get("appends_per_s"), 0),
                     f(r.get("append_ratio"), 2), f(r.get("appends_per_commit"), 2),
                     f((r.get("append_cpu_us") or {}).get("all")), f(r.get("stop_s"))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    lines += [f"N={r['journals']}: {r['error']}" for r in result["runs"] if r.get("error")]
    for r in result["runs"]:
        cpu = r.get("append_cpu_us")
        if cpu:
            lines.append(f"N={r['journals']}: CPU per append (µs): client {f(cpu['client'])}, "
                         f"coordinators {f(cpu['coordinators'])}, others {f(cpu['others'])}; "
                         f"the first append to each journal {f(r.get('first_appends_per_s'), 0)}/s")
    for r in result["runs"]:
        fo = r.get("failover")
        if fo:
            lines.append(
                f"N={r['journals']}: kill -9 of {fo['victim']} ({fo['victim_replicas']} replicas, "
                f"primary of {fo['victim_led']}), lease TTL {fo['lease_ttl_s']:g} s: new primaries "
                f"{f(fo.get('primary_s'))} s, every route full {f(fo.get('full_s'))} s, sampled "
                f"appends resumed {fo['resumed']} (worst {f(fo.get('resumed_s_max'))} s), "
                f"{fo['acked']} acknowledged, {fo['lost']} lost")
    lines += [f"N={r['journals']}: errors logged (quire_log_errors_total) by "
              + ", ".join(f"{k} {v}" for k, v in r["errors_logged"].items())
              for r in result["runs"] if any(r.get("errors_logged", {}).values())]
    lines += [f"N={r['journals']}: coordinator {i} exited ({c['exited']})"
              for r in result["runs"] for i, c in enumerate(r.get("coordinators", []))
              if "exited" in c]
    lines += [f"N={r['journals']}: {r['full_routes']}/{r['journals']} routes full when the "
              "wait ended" for r in result["runs"] if r.get("full_s") is None
              and r.get("full_routes") is not None]
    return "\n".join(lines)


def _terminate(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds through every `finally`


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n")[0])
    ap.add_argument("--journals", type=int, nargs="+", default=[10, 1000, 10000])
    ap.add_argument("--idle", type=float, default=30.0, help="seconds of idle CPU measure")
    ap.add_argument("--settle", type=float, default=10.0, help="seconds after routes are full")
    ap.add_argument("--append-seconds", type=float, default=10.0)
    ap.add_argument("--failover", action="store_true",
                    help="last, kill -9 the coordinator hosting the most replicas and time "
                         "until every route is full again (bench/scale_failover.py)")
    ap.add_argument("--lease-ttl", type=float, default=20.0,
                    help="each coordinator's --lease-ttl (the default's)")
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args(argv)
    if any(n < 1 for n in args.journals):
        ap.error("--journals: every N must be >= 1")
    signal.signal(signal.SIGTERM, _terminate)
    work = Path(tempfile.mkdtemp(prefix="quire-bench-scale-"))
    try:
        result = run_scale(args.journals, work, settle=args.settle, idle=args.idle,
                           append_s=args.append_seconds, failover=args.failover,
                           lease_ttl=args.lease_ttl,
                           say=lambda m: print(m, file=sys.stderr, flush=True))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    result["loadavg_end"] = os.getloadavg()
    if args.json:  # first: a figure is never lost to a rendering bug
        Path(args.json).write_text(json.dumps(result, indent=1, sort_keys=True))
    print(render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
