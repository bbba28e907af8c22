"""`make compose-test`: the deployment of compose/docker-compose.yml (+ compose/ci.yml's
locally built images) started, used and failed over, then removed.

 1. `docker compose up -d`: 3 etcd members, Redis, the S3 server, 3 coordinators in 2
    zones, the worker pools, beat, Flower, a consumer member, the dashboard, Spark master
    and worker, Prometheus; wait until every service runs and every health check passes,
    and the UIs answer on their published ports;
 2. the demo's steps through it (compose/smoke_steps.py in service `smoke`): journals,
    appends, a read, persistence to the store, the consumer's counts;
 3. `quire spark run hourly-counts` on the Spark master (service spark-job);
 4. a Prometheus query that sees the three coordinators' metrics;
 5. `docker kill` of the coordinator container that is primary for a journal being
    appended to: appends resume (the failover time is printed) and nothing acknowledged
    is lost; `docker start` and the coordinator rejoins the cluster;
 6. `docker compose down -v` (always, also on failure or Ctrl-C), then a check that no
    container, network or volume of the project is left.

Run it through compose/engine.sh (DOCKER_HOST) after compose/build_images.py; stdlib only.
Exit status 0 only if every step passed and nothing was left behind.
`--skip "spark job,prometheus"` leaves steps out (while working on another).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROJECT = "quire-ci"
IMAGES_ENV = REPO / "build" / "compose" / "images.env"
DC = ["docker", "compose", "-p", PROJECT, "-f", str(REPO / "compose" / "docker-compose.yml"),
      "-f", str(REPO / "compose" / "ci.yml")]
MESSAGES = 2000
FAILOVER_JOURNAL = "smoke/failover"
SERVICES = {"minio", "minio-init", "etcd-1", "etcd-2", "etcd-3", "redis", "coordinator-a1",
            "coordinator-a2", "coordinator-b1", "consumer-a1", "worker-persist", "worker-index",
            "worker-pulse", "beat", "flower", "dashboard", "spark-master", "spark-worker",
            "prometheus"}
T0 = time.monotonic()


class StepFailed(Exception):
    pass


def say(msg: str) -> None:
    print(f"[compose-test {time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def env() -> dict[str, str]:
    out = dict(os.environ)
    if not IMAGES_ENV.exists():
        raise StepFailed(f"{IMAGES_ENV} missing: run make compose-images")
    for line in IMAGES_ENV.read_text().splitlines():
        key, _, value = line.partition("=")
        out[key] = value
    return out


def dc(*args: str, check: bool = True, timeout: float = 600) -> str:
    proc = subprocess.run([*DC, *args], capture_output=True, text=True, env=env(),
                          timeout=timeout, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise StepFailed(f"docker compose {' '.join(args)} exited {proc.returncode}:\n"
                         f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return proc.stdout


def docker(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise StepFailed(f"docker {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def step(*args: str, timeout: float = 600) -> dict:
    """compose/smoke_steps.py ARGS in a one-off `smoke` container; its RESULT line."""
    out = dc("--profile", "smoke", "run", "--rm", "-T", "smoke", *args, check=False, timeout=timeout)
    res = None
    for line in out.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line.removeprefix("RESULT "))
        else:
            print(f"    {line}", flush=True)
    if res is None:
        raise StepFailed(f"step {' '.join(args)} failed")
    return res


def ps() -> dict[str, dict]:
    rows = {}
    for line in dc("ps", "-a", "--format", "json").splitlines():
        line = line.strip()
        if not line:
            continue
        items = json.loads(line)
        for row in items if isinstance(items, list) else [items]:
            rows[row["Service"]] = row
    return rows


def port(service: str, inner: int) -> str:
    out = dc("port", service, str(inner)).strip()
    if not out:
        raise StepFailed(f"{service}:{inner} is not published")
    return out.replace("0.0.0.0", "127.0.0.1")


def http(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback only
        return r.read()


def wait(what: str, check, timeout: float, every: float = 2.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except (OSError, ValueError, KeyError, StepFailed) as exc:
            last = exc
        time.sleep(every)
    raise StepFailed(f"{what}: not within {timeout:.0f}s" + (f" (last error: {last})" if last else ""))


# -- the steps ------------------------------------------------------------------------------

def start() -> float:
    started = time.monotonic()
    say("docker compose up -d (" + ", ".join(sorted(SERVICES)) + ")")
    dc("up", "-d", timeout=900)

    def healthy():
        rows = ps()
        pending = []
        for name in sorted(SERVICES):
            row = rows.get(name)
            if row is None:
                pending.append(f"{name}: no container")
            elif name == "minio-init":
                if row["State"] != "exited" or row.get("ExitCode") != 0:
                    pending.append(f"{name}: {row['State']} ({row.get('ExitCode')})")
            elif row["State"] != "running" or row.get("Health") not in ("", "healthy"):
                pending.append(f"{name}: {row['State']} {row.get('Health', '')}".strip())
        if pending:
            raise StepFailed("; ".join(pending))
        return True

    wait("every service running and healthy", healthy, 600, every=3)
    say(f"all {len(SERVICES)} services up and healthy after {time.monotonic() - started:.1f}s")
    prom = port("prometheus", 9090)
    wait("Prometheus ready", lambda: b"Ready" in http(f"http://{prom}/-/ready"), 120)
    dash = port("dashboard", 8090)
    wait("the dashboard", lambda: http(f"http://{dash}/"), 120)
    flower = port("flower", 5555)
    wait("Flower", lambda: http(f"http://{flower}/healthcheck") == b"OK", 120)
    spark = port("spark-master", 8080)
    workers = wait("a live Spark worker", lambda: json.loads(http(f"http://{spark}/json/")).get("aliveworkers"), 180)
    say(f"UIs answer on loopback: Prometheus {prom}, dashboard {dash}, Flower {flower}, "
        f"Spark master {spark} ({workers} worker alive)")
    return time.monotonic() - started


def demo_steps() -> None:
    say("journals (quire's client in the compose network)")
    step("journals")
    say(f"appending {MESSAGES} messages")
    step("append", str(MESSAGES))
    say("reading them back")
    step("read", str(MESSAGES))
    say("waiting for fragments persisted to the store by the persist workers")
    step("persisted")
    say("the consumer member counts the topic")
    step("consumer", str(MESSAGES))


def spark_job() -> None:
    say("quire spark run hourly-counts on spark://spark-master:7077 (service spark-job)")
    out = dc("--profile", "jobs", "run", "--rm", "-T", "spark-job",
             "quire", "spark", "run", "hourly-counts", "--store", "s3://quire/fragments/",
             "--selector", "prefix=smoke/events/", "--master", "spark://spark-master:7077",
             "--out", "/var/lib/quire/out/smoke-hourly", timeout=900)
    lines = [ln for ln in out.splitlines() if ln.startswith("hourly-counts:")]
    for ln in lines:
        print(f"    {ln}", flush=True)
    if not lines:
        raise StepFailed(f"the job printed no result:\n{out[-2000:]}")
    check = ("import pyarrow.parquet as pq; t = pq.read_table('/var/lib/quire/out/smoke-hourly'); "
             "print('ROWS', t.num_rows, 'MESSAGES', sum(t.column('messages').to_pylist()))")
    out = dc("--profile", "jobs", "run", "--rm", "-T", "--no-deps", "spark-job", "python", "-c", check)
    words = out.split()
    rows, messages = int(words[words.index("ROWS") + 1]), int(words[words.index("MESSAGES") + 1])
    say(f"the report (Parquet in volume spark-out): {rows} rows, {messages} of the {MESSAGES} "
        f"messages (those in persisted fragments)")
    if not (rows > 0 and 0 < messages <= MESSAGES):
        raise StepFailed("the Spark report is empty or counts too much")


def prometheus() -> None:
    prom = port("prometheus", 9090)

    def query(q: str) -> list:
        body = json.loads(http(f"http://{prom}/api/v1/query?" + urllib.parse.urlencode({"query": q})))
        return body["data"]["result"]

    def coordinators_seen():
        up = query('up{job="quire-coordinator"} == 1')
        appends = query('sum by (instance) (quire_appends_total{job="quire-coordinator"})')
        return (up, appends) if len(up) == 3 and sum(float(r["value"][1]) for r in appends) > 0 else None

    up, appends = wait("Prometheus scraping three coordinators with appends counted",
                       coordinators_seen, 180, every=5)
    say("Prometheus: up{job=\"quire-coordinator\"} == 1 for "
        + ", ".join(sorted(r["metric"]["instance"] for r in up))
        + "; quire_appends_total " + ", ".join(f"{r['metric']['instance']}={float(r['value'][1]):.0f}"
                                               for r in sorted(appends, key=lambda r: r["metric"]["instance"])))


def failover() -> float:
    route = step("route", FAILOVER_JOURNAL)
    service = route["endpoint"].rsplit(":", 1)[0]
    if service not in SERVICES:
        raise StepFailed(f"primary endpoint {route['endpoint']} is no compose service")
    container = ps()[service]["Name"]
    say(f"primary of {FAILOVER_JOURNAL}: {route['primary']} in container {container}; "
        "appending to it one message at a time")
    proc = subprocess.Popen([*DC, "--profile", "smoke", "run", "--rm", "-T", "smoke", "failover",
                             FAILOVER_JOURNAL], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env(), stdin=subprocess.DEVNULL)
    lines: list[str] = []
    ready = threading.Event()

    def pump():
        for line in proc.stdout:
            lines.append(line.rstrip())
            print(f"    {line.rstrip()}", flush=True)
            if line.strip() == "READY":
                ready.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        if not ready.wait(180):
            raise StepFailed("the appender did not get going")
        killed_at = time.time()
        docker("kill", container)
        say(f"docker kill {container}")
        proc.wait(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    results = [json.loads(ln.removeprefix("RESULT ")) for ln in lines if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not results:
        raise StepFailed("appends did not resume, or acknowledged ones were lost")
    res = results[-1]
    took = res["gap_end"] - killed_at
    say(f"FAILOVER: appends resumed {took:.1f}s after the kill "
        f"(the last ack before it {killed_at - res['gap_start']:.2f}s earlier); "
        f"{res['acked']} appends acknowledged, none lost")

    state = ps()[service]
    gone = wait(f"{route['primary']} dropped from the members (its lease expired)",
                lambda: not any(b["id"] == route["primary"] for b in step("brokers")["brokers"]) or None,
                120, every=5)
    say(f"{service} after the kill: {state['State']} ({state.get('Status', '')}), "
        f"{route['primary']} no longer a member: {gone}; docker start {container}")
    docker("start", container)

    def rejoined():
        brokers = step("brokers")["brokers"]
        mine = [b for b in brokers if b["endpoint"].startswith(service + ":") and not b["exiting"]]
        return (brokers, mine[0]) if mine and len(brokers) == 3 else None

    brokers, me = wait(f"{service} a member of the cluster again", rejoined, 240, every=5)
    state = ps()[service]
    say(f"{service} rejoined: {len(brokers)} coordinators, {me['id']} with {me['assigned']} "
        f"journal(s) assigned; container {state['State']} {state.get('Health', '')}".rstrip())
    step("append", "100")  # the cluster serves appends with it back
    return took


def leftovers() -> list[str]:
    label = f"label=com.docker.compose.project={PROJECT}"
    left = []
    for kind, argv in (("container", ["ps", "-a", "--filter", label, "--format", "{{.Names}}"]),
                       ("network", ["network", "ls", "--filter", label, "--format", "{{.Name}}"]),
                       ("volume", ["volume", "ls", "--filter", label, "--format", "{{.Name}}"])):
        left += [f"{kind} {n}" for n in docker(*argv, check=False).split()]
    for kind, argv in (("container", ["ps", "-a", "--format", "{{.Names}}"]),
                       ("network", ["network", "ls", "--format", "{{.Name}}"]),
                       ("volume", ["volume", "ls", "--format", "{{.Name}}"])):
        left += [f"{kind} {n}" for n in docker(*argv, check=False).split()
                 if n.startswith(PROJECT) and f"{kind} {n}" not in left]
    return left


def down() -> bool:
    started = time.monotonic()
    proc = subprocess.run([*DC, "--profile", "smoke", "--profile", "jobs", "down", "-v",
                           "--remove-orphans", "--timeout", "10"],
                          capture_output=True, text=True, env=env(), timeout=600)
    left = leftovers()
    say(f"docker compose down -v in {time.monotonic() - started:.1f}s; left behind: "
        + (", ".join(left) if left else f"nothing (no container, network or volume of {PROJECT})"))
    return proc.returncode == 0 and not left


def dump_logs() -> None:
    try:
        for name, row in sorted(ps().items()):
            print(f"    {name}: {row['State']} {row.get('Health', '')} {row.get('Status', '')}", flush=True)
        bad = [n for n, r in ps().items() if r["State"] != "running" or r.get("Health") == "unhealthy"]
        for name in bad[:4]:
            print(f"--- last log lines of {name}", flush=True)
            print(dc("logs", "--no-color", "--tail", "30", name, check=False), flush=True)
    except Exception as exc:  # noqa: BLE001 - diagnostics must not hide the failure
        print(f"(no diagnostics: {exc})", flush=True)


def main() -> int:
    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    figures: dict[str, float] = {}
    steps = [("start-up", start), ("demo steps", demo_steps), ("spark job", spark_job),
             ("prometheus", prometheus), ("failover", failover)]
    if len(sys.argv) > 2 and sys.argv[1] == "--skip":  # while working on one step
        steps = [(n, f) for n, f in steps if n not in sys.argv[2].split(",")]
    passed = failed = 0
    try:
        if leftovers():  # a run killed before its clean-up: start from nothing
            say("removing what an earlier run left")
            down()
        for name, fn in steps:
            took = fn()
            passed += 1
            if took is not None:
                figures[name] = took
    except (StepFailed, subprocess.TimeoutExpired) as exc:
        failed += 1
        say(f"FAILED: {exc}")
        dump_logs()
    except KeyboardInterrupt as exc:
        failed += 1
        say(f"interrupted ({exc})")
    finally:
        if down():
            passed += 1
        else:
            failed += 1
    figures["total"] = time.monotonic() - T0
    say(("PASSED" if not failed else "FAILED") + ": "
        + ", ".join(f"{k} {v:.1f}s" for k, v in figures.items()))
    # The plain closing line CI reads: the five steps and the clean `down -v`; a step not
    # reached after a failure counts as failed.
    print(f"compose-test: {passed} passed, {len(steps) + 1 - passed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
