"""`quire up` in the foreground: start a LocalCluster, keep every member running, stop.

A member that exits — a coordinator hit by `kill -9`, a worker that crashed, etcd or
Redis — is reported in one line (name, pid, exit code or signal, how long it ran, its
last log line) and restarted after a backoff, on its own data (same ports, workdir,
spool and etcd data dir), while the rest keeps serving. The decisions (backoff, crash
loops) are tools/supervision.py's; `Supervisor` is the thin adapter that watches the
processes, waits, restarts and prints. `--no-restart` leaves a member that exits down,
so its journals move to the others and stay moved.

Ctrl-C / SIGTERM stops everything in order (LocalCluster.stop, bounded by STOP_BOUND,
saying what it waits for); a second one kills every member still running at once.
During start-up the first one abandons the start (members started so far are stopped).
The exit status is 0, or 6 when the cluster could not start (another `quire up` holds
the data dir, a member never became ready) or a member crash-looped and was given up on,
or 130 when a signal came before the cluster was up.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.cluster_run import AlreadyRunning
from tools.local_cluster import LocalCluster
from tools.services import Service, ServiceError
from tools.supervision import Action, RestartPolicy, Supervision, describe_exit

__all__ = ["Supervisor", "run_foreground"]

EXIT_UNAVAILABLE = 6
EXIT_INTERRUPTED = 130
TICK = 0.2
"""Seconds between two looks at the members."""


def last_log_line(path: Path, limit: int = 200) -> str:
    """The last non-empty line of a log (read from its end only), shortened to `limit`;
    Service's own "--- quire: starting …" marker is not the member's."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines()]
    except OSError:
        return ""
    line = next((ln for ln in reversed(lines) if ln and not ln.startswith("--- quire:")), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


@dataclass
class _Member:
    svc: Service
    since: float
    """When its current run started (monotonic)."""
    state: str = "up"
    """up | waiting (dead, restart due at `due`) | starting (not ready before `due`) | down"""
    due: float = 0.0
    down_since: float = 0.0


class Supervisor:
    """Watches `services` on each `tick()`; restarts per `policy`; reports through `say`."""

    def __init__(self, services: Sequence[Service], policy: RestartPolicy,
                 say: Callable[[str], None], clock: Callable[[], float] = time.monotonic) -> None:
        self.supervision = Supervision(policy)
        self._say = say
        self._clock = clock
        now = clock()
        self.members = [_Member(svc, since=now) for svc in services]

    @property
    def crash_looped(self) -> list[str]:
        return list(self.supervision.given_up)

    def tick(self) -> None:
        now = self._clock()
        for m in self.members:
            if m.state == "up" and not m.svc.running:
                self._exited(m, now)
            elif m.state == "waiting" and now >= m.due:
                self._restart(m, now)
            elif m.state == "starting":
                if not m.svc.running:
                    self._exited(m, now, "before it was ready")
                elif self._ready(m.svc):
                    m.state = "up"
                    self._say(f"member: {m.svc.name} is back (pid {m.svc.pid}, "
                              f"{now - m.down_since:.1f}s after it exited)")
                elif now >= m.due:
                    m.svc.kill()
                    self._exited(m, now, f"not ready after {m.svc.ready_timeout:g}s")

    def _exited(self, m: _Member, now: float, note: str = "") -> None:
        svc = m.svc
        pid, code = svc.pid, svc.returncode
        last = last_log_line(svc.log_path)
        try:
            svc.stop(timeout=5)  # sweep what it left in its process group; forget it
        except ServiceError:
            pass
        decision = self.supervision.exited(svc.name, now)
        m.down_since = now
        what = (f"{svc.name} (pid {pid}) {describe_exit(code)}"
                f"{' ' + note if note else ''} after {now - m.since:.1f}s")
        if decision.action is Action.RESTART:
            m.state, m.due = "waiting", now + decision.delay
            head, tail = "member", f"restarting in {decision.delay:g}s"
        elif decision.action is Action.LEAVE_DOWN:
            m.state = "down"
            head, tail = "member", "left down (--no-restart)"
        else:
            m.state = "down"
            policy = self.supervision.policy
            head, tail = "error", (f"crash loop: {decision.exits} exits within {policy.window:g}s, "
                                   f"giving up on it (the rest keeps running)")
        self._say(f"{head}: {what}; {tail}; last log line: {last or '(empty)'} [{svc.log_path}]")

    def _restart(self, m: _Member, now: float) -> None:
        try:
            m.svc.start(wait=False)
        except ServiceError as exc:
            self._exited(m, now, f"could not start ({' '.join(str(exc).split())})")
            return
        m.state, m.since, m.due = "starting", now, now + m.svc.ready_timeout

    @staticmethod
    def _ready(svc: Service) -> bool:
        try:
            return bool(svc.probe())
        except Exception:  # noqa: BLE001 - not ready yet
            return False


def run_foreground(*, coordinators: int, store: str | None, data_dir: str | None, flower: bool,
                   zones: int, port: int, output: str = "table", tls: bool = False,
                   auth: bool = False, restart: bool = True, secure: bool = False) -> int:
    """`quire up`: start, print what runs where, supervise until Ctrl-C/SIGTERM, stop."""
    from protocol.config import default_data_dir
    from tools.output import line_buffered, make_console, make_table

    line_buffered()  # `quire up > up.log`: each line reaches the log as it is printed
    console = make_console(stderr=True)

    def say(text: str) -> None:
        console.print(text, highlight=False, markup=False)

    stop = threading.Event()
    phase = ["starting"]
    holder: list[LocalCluster] = []

    def on_signal(signum: int, frame: object) -> None:
        up = bool(holder) and holder[0].up  # its env file written: stop it as a running one
        if phase[0] == "starting" and not up:  # abandon the start: start() stops what it started
            phase[0] = "stopping"
            raise KeyboardInterrupt
        if phase[0] in ("starting", "running"):
            stop.set()
        elif holder:  # a second signal while stopping: kill what is left, now
            say("second signal: killing every member still running")
            holder[0].hurry()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    data = Path(data_dir) if data_dir else Path(os.environ.get("QUIRE_DATA_DIR")
                                                or default_data_dir())
    try:
        cluster = LocalCluster(data, coordinators=coordinators, store=store, flower=flower,
                               zones=zones, port=port, tls=tls, auth=auth, secure=secure)
    except AlreadyRunning as exc:
        say(f"error: {exc}")
        return EXIT_UNAVAILABLE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    holder.append(cluster)
    cluster.say = say
    if cluster.reaped:
        say(f"note: reaped {len(cluster.reaped)} process(es) the last quire up in "
            f"{cluster.data_dir} left running: "
            + ", ".join(f"{r.name} ({r.ident.describe()})" for r in cluster.reaped))
    custom = cluster.data_dir != default_data_dir().absolute()
    blanked = cluster.inherited_security()
    if blanked:
        flags = " ".join(f for f, on in (("--auth", auth), ("--tls", tls), ("--secure", secure)) if on)
        say(f"note: inherited {', '.join(blanked)} cleared for members: their security comes "
            f"from quire up's own flags only (here: {flags or 'none, so plain TCP and no tokens'})")
    started = time.monotonic()
    try:
        cluster.start()
        if output == "json":
            print(json.dumps({"broker": ",".join(cluster.endpoints), "etcd": cluster.etcd_url,
                              "redis": cluster.redis_url, "store": cluster.store,
                              "dashboard": cluster.dashboard_url, "tls": cluster.tls_env(),
                              "auth": ({"keys_file": cluster.keys_file, "token": cluster.admin_token}
                                       if cluster.keys_file else {}),
                              "secure": cluster.secure_exports(),
                              "data_dir": str(cluster.data_dir), "env": cluster.client_env(),
                              "blanked_for_members": blanked, "services": cluster.rows()}),
                  flush=True)
        else:
            table = make_table(f"quire is up ({time.monotonic() - started:.1f}s) — data in "
                               f"{cluster.data_dir}", ("service", "pid", "address", "log"))
            for row in cluster.rows():
                table.add_row(row["service"], str(row["pid"]), row["address"], row["log"])
            out = make_console()
            out.print(table)
            out.print(f"store: {cluster.store}\n"
                      + (f"dashboard: {cluster.dashboard_url}\n" if cluster.dashboard_url else "")
                      + f"in another shell, nothing to set{' but QUIRE_DATA_DIR' if custom else ''}"
                        f" (commands find this cluster), or: eval \"$(quire env"
                      + (f" --data-dir {cluster.data_dir}" if custom else "") + ")\"\n"
                      + "".join(f"export {k}={shlex.quote(v)}\n" for k, v in cluster.client_env().items())
                      + ("# to mint more tokens: quire auth token …\n" if cluster.keys_file else "")
                      + ("members that exit are restarted" if restart else
                         "members that exit stay down (--no-restart)")
                      + "; Ctrl-C stops everything.", highlight=False, soft_wrap=True)
        for note in cluster.notes:
            say(f"note: {note}")
        supervisor = Supervisor(list(cluster.services), RestartPolicy(restart=restart), say)
        phase[0] = "running"
        while not stop.wait(TICK):
            supervisor.tick()
        if supervisor.crash_looped:
            say(f"error: crash-looped and given up on: {', '.join(supervisor.crash_looped)}")
            return EXIT_UNAVAILABLE
        return 0
    except ServiceError as exc:
        say(f"error: {' '.join(str(exc).split()[:60])}")
        return EXIT_UNAVAILABLE
    except KeyboardInterrupt:  # a signal during start-up: start() stopped what it started
        say("interrupted while starting")
        return EXIT_INTERRUPTED
    finally:
        phase[0] = "stopping"
        try:  # (it says "stopping…" and its bound; after a failed start, nothing is left)
            cluster.stop()
        except ServiceError as exc:
            say(f"error while stopping: {exc}")
