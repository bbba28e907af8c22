"""A small real cluster for the jobs tests: two coordinators, workers and beats, a writer.

Coordinator A hosts two journals and the output (journal limit 3) and B the third, so
pausing B holds back exactly one journal's watermark. Pulses have a worker of their own
(a pulse to a paused coordinator holds a thread until its timeout; in one pool those would
starve the job sweeps); the other workers consume the rest, `jobs` included;
intervals are short (pulse 1 s, index sweep 0.5 s, refresh 1 s, jobs sweep 1 s, run
lease 3 s) so 10-second windows complete within seconds of their end.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec

from protocol import FragmentSpec, JournalSpec, LabelSet
from protocol.errors import JournalNotFound
from protocol.job import JobRun
from quire.client import SyncClient
from tests.workers.workers_support import REPO, _run, coordinator, worker_env
from tools.services import CeleryWorkerService, EtcdService, Service, free_port

JOURNALS = ("jobs/events/part-000", "jobs/events/part-001", "jobs/events/part-002")
OUTPUT = "jobs/out/all"
LABELS = LabelSet.of({"topic": "job-events"})
WINDOW = 10

INTERVALS = {
    "QUIRE_WORKER_PULSE_INTERVAL": "1",
    "QUIRE_WORKER_INDEX_SWEEP_INTERVAL": "0.5",
    "QUIRE_WORKER_JOBS_INTERVAL": "1",
    "QUIRE_WORKER_JOB_LEASE_TTL": "3",
    "QUIRE_WORKER_IO_TIMEOUT": "2",
    "QUIRE_WORKER_VISIBILITY_TIMEOUT": "30",
}


def wait_until(cond: Callable[[], Any], timeout: float, what: str, interval: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = cond()
        except Exception as exc:  # noqa: BLE001 - retried until the deadline
            last_exc, value = exc, None
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}"
                       + (f" (last error: {last_exc!r})" if last_exc else ""))


class Writer(threading.Thread):
    """Appends a JSON line to each journal ~10 times a second (300 bytes, so 4 KiB
    fragments roll by length every ~1.4 s); journals in `paused` are skipped."""

    def __init__(self, endpoints: list[str], journals: tuple[str, ...]) -> None:
        super().__init__(daemon=True)
        self.client = SyncClient(endpoints, retry_timeout=30)
        self.journals = journals
        self.paused: set[str] = set()
        self.stop_flag = threading.Event()
        self.sent = {j: 0 for j in journals}
        self.errors: list[str] = []
        self.stopped = False

    def run(self) -> None:
        n = 0
        while not self.stop_flag.is_set():
            for j in self.journals:
                if j in self.paused:
                    continue
                line = json.dumps({"key": f"k{n % 5}", "n": n, "pad": "x" * 240}) + "\n"
                try:
                    self.client.append(j, line.encode())
                    self.sent[j] += 1
                except Exception as exc:  # noqa: BLE001 - recorded; the test decides
                    self.errors.append(f"{j}: {exc!r}")
            n += 1
            self.stop_flag.wait(0.1)

    def stop(self) -> None:
        """Stop appending and close the client (once: a second call does nothing)."""
        if self.stopped:
            return
        self.stopped = True
        self.stop_flag.set()
        if self.is_alive():
            self.join(30)
        self.client.close()


class Cluster:
    def __init__(self, *, etcd: EtcdService, root: str, redis_url: str, tmp: Path) -> None:
        self.etcd, self.root, self.redis_url, self.tmp = etcd, root, redis_url, tmp
        self.store = (tmp / "store").as_uri() + "/"
        (tmp / "store").mkdir(exist_ok=True)
        self.env = {**worker_env(redis_url, etcd, root, None), **INTERVALS}
        self.services: list[Service] = []
        self.workers: list[CeleryWorkerService] = []
        self.ports: dict[str, int] = {}
        self.coordinators: dict[str, Service] = {}
        self.client: SyncClient | None = None

    # -- processes ---------------------------------------------------------------------

    def start_coordinator(self, name: str, limit: int) -> Service:
        port = free_port()
        self.ports[name] = port
        svc = coordinator(name, etcd=self.etcd, root=self.root, redis_url=self.redis_url,
                          spool_dir=str(self.tmp / f"spool-{name}"), port=port,
                          extra=("--journal-limit", str(limit), "--lease-ttl", "30"))
        self.services.append(svc)
        return svc.start()

    def start_worker(self, concurrency: int = 4,
                     queues: tuple[str, ...] = ("persist", "index", "jobs", "celery"),
                     ) -> CeleryWorkerService:
        svc = CeleryWorkerService(f"jw{uuid.uuid4().hex[:6]}", redis_url=self.redis_url,
                                  queues=queues,
                                  pool="threads", concurrency=concurrency, env=self.env)
        self.services.append(svc)
        self.workers.append(svc)
        return svc.start()

    def start_beat(self) -> Service:
        name = f"beat-{uuid.uuid4().hex[:6]}"
        svc = Service(name, [sys.executable, "-m", "celery", "-A", "workers.app", "beat",
                             "-s", str(self.tmp / f"{name}-schedule"), "--loglevel", "INFO"],
                      env=self.env)
        self.services.append(svc)
        return svc.start()

    def start_single(self) -> Cluster:
        """One coordinator for every journal (tests that pause none)."""
        self.start_coordinator("coord-a", 8)
        self.client = SyncClient([f"127.0.0.1:{self.ports['coord-a']}"], retry_timeout=30)
        self.apply_journals(JOURNALS)
        self.apply_journals((OUTPUT,), LabelSet.of({"topic": "job-output"}))
        return self

    def start(self) -> Cluster:
        self.coordinators["coord-a"] = self.start_coordinator("coord-a", 2)
        self.client = SyncClient([f"127.0.0.1:{self.ports['coord-a']}"], retry_timeout=30)
        self.apply_journals(JOURNALS[:2])
        # B joins once A is full, so one source journal is B's alone; C joins once both
        # are full. Where the output lands, and whether the allocator later moves B's
        # journal to C, depends on timing: `held` finds whichever coordinator hosts one
        # source journal alone.
        self.coordinators["coord-b"] = self.start_coordinator("coord-b", 1)
        self.apply_journals(JOURNALS[2:])
        self.coordinators["coord-c"] = self.start_coordinator("coord-c", 8)
        self.apply_journals((OUTPUT,), LabelSet.of({"topic": "job-output"}))
        return self

    def hosted(self) -> dict[str, set[str]]:
        """Each coordinator's assigned journals, from etcd."""
        async def body() -> list[str]:
            from topology.etcd import connect

            c = await connect(self.etcd.url)
            try:
                kvs = (await c.get_prefix(f"{self.root}/assign/".encode())).kvs
                return [kv.key.decode() for kv in kvs]
            finally:
                await c.close()

        out: dict[str, set[str]] = {name: set() for name in self.coordinators}
        for key in _run(body()):
            journal, _zone, member, _slot = key[len(self.root) + 8:].rsplit("#", 3)
            out.setdefault(member, set()).add(journal)
        return out

    def held(self) -> tuple[str, Service]:
        """A source journal and the coordinator that hosts it alone (no other journal, not
        the output; not A, the client's endpoint): pausing that coordinator holds back
        that journal and nothing else.
        Waited for (bounded) while the allocator settles every journal."""
        def one() -> tuple[str, Service] | None:
            hosted = self.hosted()
            if set().union(*hosted.values()) != {*JOURNALS, OUTPUT}:
                return None
            for name, journals in sorted(hosted.items()):
                if name != "coord-a" and len(journals) == 1 and next(iter(journals)) in JOURNALS:
                    return next(iter(journals)), self.coordinators[name]
            return None

        return wait_until(one, 60, "a coordinator hosting one source journal alone")

    def apply_journals(self, names: tuple[str, ...], labels: LabelSet = LABELS,
                       fragment: FragmentSpec | None = None) -> None:
        assert self.client is not None
        fragment = fragment or FragmentSpec(length=4096, compression_codec="none",
                                            stores=(self.store,), refresh_interval=1.0)
        self.client.apply([JournalSpec(name=n, replication=1, labels=labels, fragment=fragment)
                           for n in names])
        for n in names:
            wait_until(lambda n=n: self._appendable(n), 60, f"{n} to take appends")

    def _appendable(self, journal: str) -> bool:
        assert self.client is not None
        self.client.append(journal, b"", retry_timeout=2)
        return True

    @property
    def endpoints(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.ports.values()]

    def dump(self, lines: int = 30) -> str:
        return "\n".join(f"== {svc.name}\n{svc.log_tail(lines)}" for svc in self.services)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        for svc in reversed(self.services):
            svc.close()

    # -- etcd / CLI ----------------------------------------------------------------------

    def cli(self, *args: str, check: bool = True, etcd: bool = True,
            **env: str) -> subprocess.CompletedProcess[str]:
        tail = ["--etcd", self.etcd.url, "--root", self.root] if etcd else []
        proc = subprocess.run([sys.executable, "-m", "tools.cli.main", *args, *tail],
                              capture_output=True, text=True, timeout=60, cwd=REPO,
                              env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin",
                                   "COLUMNS": "250", **env})
        if check and proc.returncode != 0:
            raise AssertionError(f"quire {' '.join(args)} exited {proc.returncode}: "
                                 f"{proc.stderr}{proc.stdout}")
        return proc

    def apply_job(self, spec: dict[str, Any]) -> None:
        path = self.tmp / f"job-{uuid.uuid4().hex[:6]}.yaml"
        import yaml

        path.write_text(yaml.safe_dump(spec))
        self.cli("jobs", "apply", "-f", str(path))

    def runs(self, job: str) -> list[JobRun]:
        from topology.jobs import list_runs

        async def body() -> list[JobRun]:
            from topology.etcd import connect

            c = await connect(self.etcd.url)
            try:
                return [e.run for e in await list_runs(c, self.root, job)]
            finally:
                await c.close()

        return _run(body())

    def output_rows(self, journal: str) -> list[dict[str, Any]]:
        assert self.client is not None
        try:
            data = self.client.read_all(journal, 0)
        except JournalNotFound:  # not created yet (any other error fails the test)
            return []
        return [json.loads(line) for line in data.splitlines() if line.strip()]

    def lines_in(self, journal: str, begin: int, end: int) -> int:
        assert self.client is not None
        if end <= begin:
            return 0
        data = b""
        for offset, chunk in self.client.read(journal, begin, end_offset=end):
            data += bytes(chunk)[: max(0, end - offset)]
            if offset + len(chunk) >= end:
                break
        return sum(1 for line in data.splitlines() if line.strip())


def decode_run(raw: bytes) -> JobRun:
    return msgspec.json.decode(raw, type=JobRun)


@contextmanager
def single_job_cluster(etcd: EtcdService, root: str, redis_url: str,
                       tmp: Path) -> Iterator[tuple[Cluster, Writer]]:
    """One coordinator for every journal, a pulse worker, a jobs worker, beat, and a
    Writer appending to JOURNALS; the cluster's logs printed if the body fails, and
    everything stopped afterwards."""
    cluster = Cluster(etcd=etcd, root=root, redis_url=redis_url, tmp=tmp)
    writer = None
    try:
        cluster.start_single()
        cluster.start_worker(concurrency=4, queues=("pulse",))
        cluster.start_worker(concurrency=4)
        cluster.start_beat()
        writer = Writer(cluster.endpoints, JOURNALS)
        writer.start()
        yield cluster, writer
    except BaseException:
        print(cluster.dump(60))
        raise
    finally:
        if writer is not None:
            writer.stop()
        cluster.close()

