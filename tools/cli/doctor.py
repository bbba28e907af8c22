"""`quire doctor`: check a cluster end to end and say what mends each thing wrong.

Checks (tools/doctor_probe.py gathers, tools/doctor_checks.py judges): a local cluster
left running without its `quire up`; etcd (quorum, access to the cluster's prefix);
Redis; each coordinator (Hello, spool health); each live worker and the stores it
writes to; journals without a full route or whose store no worker accepts;
persistence backlog and refused persist tasks; jobs whose next window waits; the TLS
certificates the settings name; clock skew. Exit 0 when nothing fails (warnings
allowed), 6 (EXIT_UNAVAILABLE) when something does.
"""

from __future__ import annotations

import enum
import json
import os
import sys

import typer

from protocol.config import default_data_dir
from tools.doctor_checks import Finding, Level, exit_ok
from tools.doctor_probe import Limits, gather

from .common import EXIT_UNAVAILABLE, emit_table, settings, stdout

__all__ = ["doctor"]


class Format(str, enum.Enum):
    table = "table"
    lines = "lines"
    json = "json"


_MARK = {Level.OK: "ok", Level.WARN: "WARN", Level.FAIL: "FAIL"}


def _render(findings: list[Finding], fmt: Format, show_ok: bool) -> None:
    shown = [f for f in findings if show_ok or f.level is not Level.OK]
    if fmt is Format.json:
        sys.stdout.write(json.dumps({"ok": exit_ok(findings),
                                     "findings": [f.to_obj() for f in findings]}, indent=1) + "\n")
        return
    if fmt is Format.lines:
        for f in shown:
            stdout.print(f"{_MARK[f.level]:4} {f.name}: {f.subject}: {f.message}"
                         + (f"\n     mend: {f.mend}" if f.mend else ""), highlight=False,
                         markup=False)
    else:
        emit_table(None, ["", "check", "subject", "finding", "mend"],
                   [(_MARK[f.level], f.name, f.subject, f.message, f.mend or "-") for f in shown])
    bad = sum(f.level is Level.FAIL for f in findings)
    warn = sum(f.level is Level.WARN for f in findings)
    stdout.print(f"{len(findings)} checks: {bad} failing, {warn} warning"
                 + ("" if show_ok else " (--all shows the passing ones)"), highlight=False)


def doctor(data_dir: str = typer.Option(None, "--data-dir",
                                        help="A local cluster's data directory, checked for "
                                             "processes left without their quire up (default: "
                                             "$QUIRE_DATA_DIR or ~/.local/share/quire)."),
           etcd: str = typer.Option(None, "--etcd", help="etcd URL (default $QUIRE_ETCD_URL)."),
           root: str = typer.Option(None, "--root", help="etcd key prefix (default "
                                                         "$QUIRE_ETCD_ROOT or /quire)."),
           redis_url: str = typer.Option(None, "--redis", help="The workers' Redis (default "
                                                               "$QUIRE_REDIS_URL)."),
           fmt: Format = typer.Option(Format.table, "--format", "-o", "--output",
                                      help="table, lines or json."),
           show_all: bool = typer.Option(False, "--all", help="Show passing checks too."),
           timeout: float = typer.Option(3.0, "--timeout", help="Seconds for each service "
                                                                "to answer."),
           job_grace: float = typer.Option(300.0, "--job-grace",
                                           help="Seconds a job's window may be due before it "
                                                "is reported as waiting."),
           backlog_age: float = typer.Option(300.0, "--backlog-age",
                                             help="Seconds of unpersisted data before it is "
                                                  "reported."),
           max_skew: float = typer.Option(5.0, "--max-skew",
                                          help="Seconds two clocks may differ.")) -> None:
    """Check the cluster end to end; print each finding with the command that mends it;
    exit non-zero when something is wrong."""
    from protocol.logs import configure_logging

    configure_logging("console", "WARNING", stream=sys.stderr)  # stdout is the report
    if data_dir:  # discovery (protocol/discovery.py) reads the cluster this dir runs
        os.environ["QUIRE_DATA_DIR"] = data_dir
    s = settings()
    overrides = {k: v for k, v in (("etcd_url", etcd), ("redis_url", redis_url)) if v}
    if overrides:
        import msgspec

        s = msgspec.structs.replace(s, **overrides)
    directory = data_dir or os.environ.get("QUIRE_DATA_DIR") or str(default_data_dir())
    limits = Limits(timeout=timeout, job_grace=job_grace, backlog_age=backlog_age,
                    max_skew=max_skew)
    findings = gather(s, directory, limits, root=root)
    _render(findings, fmt, show_all or fmt is Format.json)
    if not exit_ok(findings):
        raise typer.Exit(EXIT_UNAVAILABLE)
