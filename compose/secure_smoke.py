"""`make compose-test`, second half: the secure deployment (compose/secure.yml +
compose/ci-secure.yml over docker-compose.yml + ci.yml) started, used, refused, removed.

 1. `python -m tools.compose_secrets make build/compose/secrets-ci`: new certificates,
    Redis ACL users, signing keys and tokens for this run (removed again at the end);
 2. `docker compose up -d` of the core: 3 etcd members (TLS, client certificates, auth
    on after etcd-init), Redis (TLS and ACL users only), the S3 server, 3 coordinators
    (--auth --tls), the persist and index workers (signed tasks only); wait until healthy;
 3. through them, as an operator (mTLS, the operator's token, etcd as the quire user):
    journals, appends, a read, fragments persisted by the workers (compose/smoke_steps.py);
 4. the refusals: etcd over plain HTTP and without a client certificate, Redis without a
    password and over plain TCP, and an unsigned persist task pushed into Redis with the
    coordinators' own Redis user: worker-persist logs the refusal and counts it;
 5. `docker compose down -v` (always), then a check that nothing of the project is left.

Run through compose/engine.sh after compose/build_images.py (as compose/smoke.py, whose
helpers this reuses). Exit status 0 only if every step passed and nothing was left.
QUIRE_COMPOSE_PROJECT names the compose project (default quire-sec-ci).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import smoke  # noqa: E402 - compose/smoke.py: dc, step, ps, wait, down, leftovers

REPO = smoke.REPO
PROJECT = os.environ.get("QUIRE_COMPOSE_PROJECT", "quire-sec-ci")
SECRETS = REPO / "build" / "compose" / "secrets-ci"
FILES = ["docker-compose.yml", "ci.yml", "secure.yml", "ci-secure.yml"]
SERVICES = {"minio", "minio-init", "etcd-1", "etcd-2", "etcd-3", "etcd-init", "redis",
            "coordinator-a1", "coordinator-a2", "coordinator-b1", "worker-persist", "worker-index"}
ONE_SHOT = {"minio-init", "etcd-init"}
MESSAGES = 2000  # as compose/smoke.py: enough that every partition rolls 8 KiB fragments
say = smoke.say

_plain_env = smoke.env


def secure_env() -> dict[str, str]:
    """compose/smoke.py's environment (the image tags) + the secrets' env file."""
    out = _plain_env()
    env_file = SECRETS / "secure.env"
    if not env_file.exists():
        raise smoke.StepFailed(f"{env_file} missing: the secrets step did not run")
    for line in env_file.read_text().splitlines():
        key, _, value = line.partition("=")
        out[key] = value
    return out


# smoke.py's helpers, pointed at this project and these files.
smoke.PROJECT = PROJECT
smoke.DC = ["docker", "compose", "-p", PROJECT,
            *(a for f in FILES for a in ("-f", str(REPO / "compose" / f)))]
smoke.SERVICES = SERVICES
smoke.env = secure_env


def make_secrets() -> None:
    shutil.rmtree(SECRETS, ignore_errors=True)
    proc = subprocess.run([sys.executable, "-m", "tools.compose_secrets", "make", str(SECRETS)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise smoke.StepFailed(f"tools.compose_secrets make: {proc.stderr.strip()}")
    say(f"secrets made under {SECRETS.relative_to(REPO)} (keys 0600, owner uid 10001)")


def start() -> float:
    started = time.monotonic()
    say("docker compose up -d (" + ", ".join(sorted(SERVICES - ONE_SHOT)) + ")")
    smoke.dc("up", "-d", *sorted(SERVICES - ONE_SHOT), timeout=900)

    def healthy() -> bool:
        rows = smoke.ps()
        pending = []
        for name in sorted(SERVICES):
            row = rows.get(name)
            if row is None:
                pending.append(f"{name}: no container")
            elif name in ONE_SHOT:
                if row["State"] != "exited" or row.get("ExitCode") != 0:
                    pending.append(f"{name}: {row['State']} ({row.get('ExitCode')})")
            elif row["State"] != "running" or row.get("Health") not in ("", "healthy"):
                pending.append(f"{name}: {row['State']} {row.get('Health', '')}".strip())
        if pending:
            raise smoke.StepFailed("; ".join(pending))
        return True

    smoke.wait("every service running and healthy", healthy, 420, every=3)
    init = smoke.dc("logs", "--no-color", "etcd-init", check=False)
    say(f"all {len(SERVICES)} services up after {time.monotonic() - started:.1f}s; etcd-init: "
        + "; ".join(ln.split("etcd-init: ", 1)[1] for ln in init.splitlines() if "etcd-init: " in ln))
    return time.monotonic() - started


def allowed() -> None:
    say("journals, appends, a read (mTLS and the operator's token; etcd as user quire)")
    smoke.step("journals")
    smoke.step("append", str(MESSAGES))
    smoke.step("read", str(MESSAGES))
    say("fragments persisted by worker-persist (signed tasks, Redis user quire-worker over TLS)")
    smoke.step("persisted")


def refusals() -> None:
    say("the doors: etcd plain HTTP / no client certificate, Redis no password / plain TCP")
    res = smoke.step("refusals")
    forged = res["forged"]
    metrics_cmd = ("import urllib.request; print(urllib.request.urlopen("
                   "'http://127.0.0.1:9200/metrics', timeout=5).read().decode())")

    def refused() -> str | None:
        logs = smoke.dc("logs", "--no-color", "worker-persist", check=False)
        line = next((ln for ln in logs.splitlines() if forged in ln and "task refused" in ln), None)
        if line is None:
            return None
        metrics = smoke.dc("exec", "-T", "worker-persist", "python", "-c", metrics_cmd, check=False)
        m = re.search(r'quire_worker_refused_tasks_total\{reason="unsigned",'
                      r'task="workers.persist.persist_fragment"\} ([0-9.]+)', metrics)
        return f"{line.strip()[-240:]} (counted: {m.group(1)})" if m and float(m.group(1)) >= 1 else None

    seen = smoke.wait("worker-persist to refuse and count the unsigned task", refused, 90, every=2)
    say(f"worker-persist refused it: {seen}")


def main() -> int:
    def on_signal(signum, _frame):  # noqa: ANN001
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    steps = [("secrets", make_secrets), ("start-up", start), ("allowed paths", allowed),
             ("refusals", refusals)]
    figures: dict[str, float] = {}
    passed = failed = 0
    try:
        for name, fn in steps:
            if name == "start-up" and smoke.leftovers():  # a run killed before its clean-up
                say("removing what an earlier run left")
                smoke.down()
            took = fn()
            passed += 1
            if took is not None:
                figures[name] = took
    except (smoke.StepFailed, subprocess.TimeoutExpired, urllib.error.URLError) as exc:  # type: ignore[attr-defined]
        failed += 1
        say(f"FAILED: {exc}")
        smoke.dump_logs()
        for name in ("worker-persist", "worker-index", "coordinator-a1"):  # running, but maybe refusing
            print(f"--- last log lines of {name}", flush=True)
            print(smoke.dc("logs", "--no-color", "--tail", "15", name, check=False)[-4000:], flush=True)
    except KeyboardInterrupt as exc:
        failed += 1
        say(f"interrupted ({exc})")
    finally:
        # `down` needs the secrets' env file (compose interpolates it): remove them after.
        ok = smoke.down() if (SECRETS / "secure.env").exists() else not smoke.leftovers()
        shutil.rmtree(SECRETS, ignore_errors=True)
        if ok:
            passed += 1
        else:
            failed += 1
    figures["total"] = time.monotonic() - smoke.T0
    say(("PASSED" if not failed else "FAILED") + ": "
        + ", ".join(f"{k} {v:.1f}s" for k, v in figures.items()))
    print(f"compose-test (secure): {passed} passed, {len(steps) + 1 - passed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
