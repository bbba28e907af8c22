"""`make run` / `quire demo` / `python -m tools.demo`: quire end to end, then stop.

1. start a local cluster (`quire up`'s LocalCluster: etcd, redis-server, 2 coordinators,
   Celery worker and beat — all subprocesses) in a fresh data directory;
2. apply a topic `events` of 4 journals (label `topic=events`, partitions as journals)
   and a job over them (as `quire jobs apply` does), starting now;
3. append 4,000 JSON messages through AppendService, keyed by user (rendezvous mapping);
4. tail one partition and show its first messages with their offsets;
5. wait (bounded) until every partition has fragments persisted to the store, and list
   them with their store paths;
6. when `spark/jobs` exists, run the example batch job over the store (no brokers);
7. run the continuous minute-counts job (Structured Streaming: journals in, a journal
   out) until it has counted everything, showing its micro-batches;
8. run the consumer count example (a stateful shard over the topic, totals to a journal:
   tools/demo_consumer.py) and show its totals;
9. the job applied at step 2 (tools/demo_jobs.py: counts per key every 10 s window, run by
   the workers once the window is persisted): wait until its first window succeeded and
   show its runs as `quire jobs runs` does.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from quire.client import AppendService, Client, Mapper, encode, read_messages
from protocol import Codec, FragmentSpec, JournalSpec, LabelSet
from tools import demo_jobs
from tools.lifetime import dying_with_us, interrupt_on_sigterm
from tools.local_cluster import ROOT
from tools.output import line_buffered, make_console, make_table
from tools.services import ServiceError
from tools.services.process import free_port

console = make_console()
PARTITIONS = 4
MESSAGES = 4000
PERSIST_WAIT = 90.0


def _specs(store: str) -> list[JournalSpec]:
    # flush_interval: once the appends stop, the last fragments are closed and persisted
    # within a minute, so the job's windows (tools/demo_jobs.py) complete during the demo.
    fragment = FragmentSpec(length=32 << 10, compression_codec=Codec.GZIP, stores=(store,),
                            refresh_interval=1.0, flush_interval=60.0)
    ndjson = {"content-type": "application/x-ndjson"}
    return [*(JournalSpec(name=f"demo/events/part-{i:03d}", replication=2,
                          labels=LabelSet.of({"topic": "events", **ndjson}), fragment=fragment)
              for i in range(PARTITIONS)),
            JournalSpec(name=demo_jobs.OUTPUT, replication=2, labels=LabelSet.of(ndjson),
                        fragment=fragment)]


async def _scenario(endpoints: list[str], store: str, etcd_url: str, data_dir: Path) -> list[str]:
    async with Client(endpoints, retry_timeout=30) as client:
        revision = await client.apply(_specs(store))
        console.print(f"applied topic [bold]events[/]: {PARTITIONS} journals (and "
                      f"{demo_jobs.OUTPUT}) at etcd revision {revision}")
        await demo_jobs.apply_job(etcd_url, ROOT, data_dir)

        mapper = Mapper("topic=events", client)
        started = time.monotonic()
        base = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
        async with AppendService(client) as svc:
            futures = []
            for n in range(MESSAGES):
                user = f"user-{n % 37:02d}"
                ts = (base + dt.timedelta(minutes=n)).isoformat()
                journal = await mapper.map(user)
                futures.append(await svc.append(journal, encode({"key": user, "ts": ts, "n": n})))
            await svc.flush(timeout=60)
        spans = [f.result() for f in futures]
        console.print(f"appended {MESSAGES} messages ({sum(s.size for s in spans)} bytes) in "
                      f"{time.monotonic() - started:.2f}s through AppendService")

        journals = list(mapper.journals)
        tail = journals[0]
        shown = []
        async for offset, message in read_messages(client.read(tail)):
            if len(shown) < 3:
                shown.append((offset, message))
        console.print(f"tail of {tail}: first messages")
        for offset, message in shown:
            console.print(f"  offset {offset:>6}  {message}", highlight=False)

        deadline = time.monotonic() + PERSIST_WAIT
        while True:
            fragments = {j: await client.list_fragments(j) for j in journals}
            persisted = {j: [f for f in fs if f.spec.is_persisted] for j, fs in fragments.items()}
            if all(persisted.values()) or time.monotonic() > deadline:
                break
            await asyncio.sleep(1.0)
        table = make_table("fragments (persisted ones are in the store)",
                           ("journal", "begin", "end", "where", "path"))
        from fragment_store.keys import fragment_key

        for journal, infos in fragments.items():
            for info in infos:
                f = info.spec
                where = "store" if f.is_persisted else "coordinator disk"
                path = f.backing_store + fragment_key(f) if f.is_persisted else "-"
                table.add_row(journal, str(f.begin), str(f.end), where, path)
        console.print(table)
        missing = [j for j, fs in persisted.items() if not fs]
        if missing:
            raise RuntimeError(f"no fragment of {', '.join(missing)} was persisted within "
                               f"{PERSIST_WAIT:.0f}s (is the Celery worker running?)")
        return journals


def _spark_job(data_dir: Path, store: str) -> int:
    jobs = Path(__file__).resolve().parent.parent / "spark" / "jobs"
    if not jobs.is_dir():
        console.print("spark/jobs not present: skipping the batch job")
        return 0
    out = data_dir / "hourly-counts"
    argv = [sys.executable, "-m", "spark.main", "run", "hourly-counts", "--store", store,
            "--selector", "prefix=demo/events/", "--out", str(out), "--master", "local[2]"]
    console.print(f"running the example batch job: {' '.join(argv[2:])}", highlight=False)
    try:
        proc = subprocess.run(dying_with_us(argv), capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        console.print("[red]batch job timed out after 300s[/]")
        return 1
    # Spark's stage progress bars and log noise are not the job's result.
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines()
             if ln.strip() and "WARN" not in ln and "Stage" not in ln and not ln.strip().endswith("]")]
    for line in (proc.stdout.strip().splitlines() if proc.returncode == 0 else lines)[-5:]:
        console.print(f"  {line}", highlight=False, markup=False)
    if proc.returncode != 0:
        console.print(f"[red]batch job failed with exit code {proc.returncode}[/]")
    return proc.returncode


def _streaming_job(endpoints: list[str]) -> int:
    """A few micro-batches of the continuous job: topic events -> demo/minute-counts."""
    job = Path(__file__).resolve().parent.parent / "spark" / "jobs" / "minute_counts.py"
    if not job.is_file():
        return 0
    argv = [sys.executable, "-m", "spark.jobs.minute_counts", "--brokers", ",".join(endpoints),
            "--selector", "topic=events", "--out-journal", "demo/minute-counts",
            "--max-bytes-per-trigger", str(100 << 10), "--until-idle", "--master", "local[2]"]
    console.print(f"running the continuous job: {' '.join(argv[2:])}", highlight=False)
    try:
        proc = subprocess.run(dying_with_us(argv), capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        console.print("[red]streaming job timed out after 300s[/]")
        return 1
    for line in proc.stdout.strip().splitlines()[-8:]:
        console.print(f"  {line}", highlight=False, markup=False)
    if proc.returncode != 0:
        console.print(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "",
                      highlight=False, markup=False)
        console.print(f"[red]streaming job failed with exit code {proc.returncode}[/]")
    return proc.returncode


def main(data_dir: str | None = None) -> int:
    from tools.local_cluster import LocalCluster

    line_buffered()  # `make run > log`: each line reaches the log as it is printed
    interrupt_on_sigterm()  # SIGTERM stops the cluster as Ctrl-C does
    root = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="quire-demo-"))
    started = time.monotonic()
    try:
        with LocalCluster(root, coordinators=2, port=free_port()) as cluster:
            table = make_table("local cluster", ("service", "pid", "address"))
            for row in cluster.rows():
                table.add_row(row["service"], str(row["pid"]), row["address"])
            console.print(table)
            for note in cluster.notes:
                console.print(f"note: {note}")
            asyncio.run(_scenario(cluster.endpoints, cluster.store, cluster.etcd_url, root))
            # The batch job needs only the store; the cluster stays up meanwhile so the
            # index manifest keeps being refreshed by the workers.
            code = _spark_job(root, cluster.store)
            code = _streaming_job(cluster.endpoints) or code
            from tools.demo_consumer import consumer_step

            code = consumer_step(cluster.endpoints, cluster.etcd_url, ROOT, cluster.store, MESSAGES,
                                 root / "consumer") or code
            code = demo_jobs.show_runs(cluster.etcd_url, ROOT, MESSAGES) or code
            console.print("stopping the cluster")
    except (ServiceError, RuntimeError, OSError) as exc:
        console.print(f"[red]demo failed:[/] {' '.join(str(exc).split()[:80])}")
        return 1
    except Exception as exc:  # noqa: BLE001 - a demo reports, it does not trace back
        console.print(f"[red]demo failed:[/] {type(exc).__name__}: {exc}")
        return 1
    console.print(f"demo finished in {time.monotonic() - started:.1f}s (data in {root})")
    return code


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))
