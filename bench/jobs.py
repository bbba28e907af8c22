"""How soon a job's window runs after it ends: window end -> the run's first start.

    python -m bench.jobs [--windows 4] [--window 10] [--json OUT]

A local cluster (`tools.local_cluster`: etcd, Redis, one coordinator, a Celery worker
and beat) with short intervals — pulse 1 s, index sweep 0.5 s, refresh 1 s, jobs sweep
1 s — three journals written steadily (4 KiB fragments roll by length every ~1.4 s at
the write rate), and a job of 10 s windows with the built-in `window_counts` target.
For each window the run's first start minus the window's end is the delay; it is set
against what it depends on: the roll time at this write rate + the refresh interval +
the pulse interval, and the goal `roll + refresh + 2 s`. Timings on a shared machine
are not final figures: the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import threading
import time
from typing import Any

from bench.common import write_json

INTERVALS = {"QUIRE_WORKER_PULSE_INTERVAL": "1", "QUIRE_WORKER_INDEX_SWEEP_INTERVAL": "0.5",
             "QUIRE_WORKER_JOBS_INTERVAL": "1", "QUIRE_WORKER_JOB_LEASE_TTL": "5"}
REFRESH = 1.0
LENGTH = 4096
LINE = 300
RATE = 10  # lines per second per journal


def _writer(endpoints: list[str], journals: list[str], stop: threading.Event) -> None:
    from quire.client import SyncClient

    with SyncClient(endpoints, retry_timeout=30) as client:
        n = 0
        while not stop.is_set():
            for j in journals:
                line = json.dumps({"key": f"k{n % 5}", "n": n}).ljust(LINE - 1) + "\n"
                client.append(j, line.encode())
            n += 1
            stop.wait(1 / RATE)


def _runs(etcd_url: str, root: str, job: str) -> list[Any]:
    from topology.etcd import connect
    from topology.jobs import list_runs

    async def body() -> list[Any]:
        c = await connect(etcd_url)
        try:
            return [e.run for e in await list_runs(c, root, job)]
        finally:
            await c.close()

    return asyncio.run(body())


def run(windows: int, window: int) -> dict[str, Any]:
    os.environ.update(INTERVALS)
    from protocol import FragmentSpec, JournalSpec, LabelSet
    from protocol.job import JobSpec, JobTarget, window_of
    from quire.client import SyncClient
    from tools.local_cluster import ROOT, LocalCluster
    from topology.etcd import connect
    from topology.jobs import apply_job

    data = tempfile.mkdtemp(prefix="quire-bench-jobs-")
    journals = [f"bench/jobs/part-{i:03d}" for i in range(3)]
    with LocalCluster(data, coordinators=1) as cluster:
        with SyncClient(cluster.endpoints, retry_timeout=30) as client:
            client.apply([JournalSpec(name=j, replication=1,
                                      labels=LabelSet.of({"topic": "bench-jobs"}),
                                      fragment=FragmentSpec(length=LENGTH, compression_codec="none",
                                                            stores=(cluster.store,),
                                                            refresh_interval=REFRESH))
                          for j in journals])
            for j in journals:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        client.append(j, b"", retry_timeout=2)
                        break
                    except Exception:  # noqa: BLE001 - the route is forming
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.2)
        stop = threading.Event()
        writer = threading.Thread(target=_writer, args=(cluster.endpoints, journals, stop),
                                  daemon=True)
        writer.start()
        start = window_of(time.time(), window) + window
        spec = JobSpec(name="bench", selector="topic=bench-jobs", window=window,
                       target=JobTarget(kind="celery", name="workers.jobs_targets.window_counts"),
                       start=float(start), max_concurrent=2)

        async def apply() -> None:
            c = await connect(cluster.etcd_url)
            try:
                await apply_job(c, ROOT, spec)
            finally:
                await c.close()

        asyncio.run(apply())
        deadline = time.time() + start - time.time() + (windows + 6) * window + 60
        started: list[Any] = []
        while time.time() < deadline:
            started = [r for r in _runs(cluster.etcd_url, ROOT, "bench") if r.attempts]
            if len(started) >= windows:
                break
            time.sleep(1)
        stop.set()
        writer.join(10)
    delays = sorted(r.attempts[0].started - r.window_end for r in started[:windows])
    roll = LENGTH / (LINE * RATE)
    pulse = float(INTERVALS["QUIRE_WORKER_PULSE_INTERVAL"])
    return {"windows": len(delays), "window_seconds": window, "delays": delays,
            "median": statistics.median(delays) if delays else None,
            "max": max(delays) if delays else None, "roll_seconds": roll,
            "refresh_seconds": REFRESH, "pulse_seconds": pulse,
            "goal_seconds": roll + REFRESH + 2, "load": os.getloadavg()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--windows", type=int, default=4)
    p.add_argument("--window", type=int, default=10)
    p.add_argument("--json", default=None)
    ns = p.parse_args(argv)
    r = run(ns.windows, ns.window)
    if not r["delays"]:
        print("jobs: no run started")
        return 1
    print(f"jobs: window end -> run start over {r['windows']} windows of {r['window_seconds']}s: "
          f"median {r['median']:.2f}s, max {r['max']:.2f}s; depends on roll "
          f"{r['roll_seconds']:.1f}s + refresh {r['refresh_seconds']:.1f}s + pulse "
          f"{r['pulse_seconds']:.1f}s; goal <= roll + refresh + 2 s = {r['goal_seconds']:.1f}s "
          f"(median/goal {r['median'] / r['goal_seconds']:.2f}); load {r['load'][0]:.2f}")
    write_json(ns.json, r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
