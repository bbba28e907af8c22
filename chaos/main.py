"""`quire chaos`: a seeded fault-injection run with a checker; exits non-zero if any
safety count is above zero.

    quire chaos --duration 300 --seed 7 --json chaos.json
    quire chaos --campaign 20 --duration 300 --seed 1 --campaign-doc docs/reliability.md
    quire chaos --no-consumers          # brokers only (no consumer group, no consumer faults)
    quire chaos --hosts 5 --duration 120  # on simulated hosts, faults at the network layer
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from protocol.logs import configure_logging
from tools.services import ServiceError

from .bounded import run as bounded_run
from .checker import SAFETY_KEYS, Report
from .runner import ChaosConfig, default_history_path, run_chaos
from .net_faults import NET_LAYER_KINDS
from .schedule import DISK_KINDS, CONSUMER_KINDS, FaultKind

NET_LAYER_VALUES = frozenset(k.value for k in NET_LAYER_KINDS)
PROXY_OR_SINGLE_ETCD = (FaultKind.NET_CLIENT, FaultKind.NET_PEER, FaultKind.PAUSE_ETCD,
                        FaultKind.ETCD_RESTART)

__all__ = ["command", "render", "main"]


def render(report: Report, meta: dict[str, Any], console: Console) -> None:
    t = Table(title="appends", show_header=True)
    for k in ("invoked", "acknowledged", "definite_failures", "indefinite_failures"):
        t.add_column(k, justify="right")
    t.add_row(*(str(report.appends[k]) for k in ("invoked", "acknowledged", "definite_failures",
                                                 "indefinite_failures")))
    console.print(t)
    s = Table(title="safety (each must be 0)")
    s.add_column("check")
    s.add_column("count", justify="right")
    s.add_column("first example", overflow="fold")
    for k in SAFETY_KEYS:
        n = report.counts[k]
        s.add_row(k, f"[{'red' if n else 'green'}]{n}[/]", (report.examples.get(k) or [""])[0])
    console.print(s)
    f = Table(title="faults injected")
    f.add_column("kind")
    f.add_column("count", justify="right")
    for k, n in sorted(report.faults.items()):
        f.add_row(k, str(n))
    console.print(f)
    r = report.recovery
    console.print(f"recovery after primary kill: kills={r['kills']} recovered={r['recovered']} "
                  f"p50={r['p50']}s max={r['max']}s")
    console.print(f"liveness: journals unavailable after heal="
                  f"{report.counts['unavailable_after_heal']}, stale heads after heal="
                  f"{report.counts['stale_heads']}, journals completed from replicas/store="
                  f"{report.counts['reconstructed']}, harness stalls="
                  f"{report.counts.get('harness_stalls', 0)}")
    for stall in report.examples.get("harness_stalls", []):
        console.print(f"  [red]harness stall[/] {stall}")
    console.print(f"caught crashes in the coordinators' logs: {report.counts.get('caught_crashes', 0)}")
    for crash in report.examples.get("caught_crashes", []):
        console.print(f"  [red]caught crash[/] {crash}")
    console.print(f"indefinite appends visible={report.counts['indefinite_visible']} "
                  f"absent={report.counts['indefinite_absent']}; fragments checked="
                  f"{report.counts['fragments_checked']}; peer links proxied="
                  f"{meta.get('peer_links_proxied')}")
    if meta.get("hosts"):
        net = sum(n for k, n in report.faults.items() if k in NET_LAYER_VALUES)
        minutes = float(meta["config"]["duration"]) / 60.0
        console.print(f"hosts: {len(meta['hosts'])}; network-layer faults={net} "
                      f"({net / minutes:.2f}/min)")
        for kind, r in (meta.get("host_recovery") or {}).items():
            console.print(f"recovery after {kind} of a primary's host: faults={r['faults']} "
                          f"recovered={r['recovered']} p50={r['p50']}s max={r['max']}s "
                          f"(lease TTL {meta['config']['lease_ttl']} s)")
    if meta.get("skipped_faults"):
        console.print(f"[yellow]faults skipped: {len(meta['skipped_faults'])}[/] "
                      f"({meta['skipped_faults'][0]})")
    c = report.counts
    if meta.get("consumers") is not None:
        cm = meta["consumers"]
        changes = sum(cm.get("primary_changes", {}).values())
        console.print(f"consumers: consumer_keys={c.get('consumer_keys', 0)} "
                      f"consumer_mismatches={c.get('consumer_mismatches', 0)} "
                      f"consumer_overcounted={c.get('consumer_overcounted', 0)} "
                      f"consumer_undercounted={c.get('consumer_undercounted', 0)} "
                      f"consumer_dual_primaries={c.get('consumer_dual_primaries', 0)} "
                      f"consumer_zombie_commits={c.get('consumer_zombie_commits', 0)} "
                      f"consumer_bad_offsets={c.get('consumer_bad_offsets', 0)} "
                      f"consumer_output_mismatches={c.get('consumer_output_mismatches', 0)} "
                      f"consumer_output_duplicates={c.get('consumer_output_duplicates', 0)} "
                      f"(outputs checked {c.get('consumer_outputs_checked', 0)})")
        console.print(f"consumers: messages={c.get('consumer_messages', 0)} "
                      f"counted={c.get('consumer_counted', 0)} shard primary changes={changes} "
                      f"behind={c.get('consumer_behind', 0)} read_errors="
                      f"{c.get('consumer_read_errors', 0)} caught up in "
                      f"{cm.get('caught_up_seconds')}s; etcd polls={c.get('consumer_watch_polls', 0)} "
                      f"(failed {cm.get('watch_failed_polls', 0)}); event appends "
                      f"{cm.get('event_appends')}")
        for line in report.examples.get("consumer_mismatches", [])[:5]:
            console.print(f"  [red]mismatch[/] {line}")
        for shard, info in sorted(report.consumers.items()):
            if info.get("first_divergence"):
                console.print(f"  [red]{shard}[/] {info['first_divergence']}")
    writers = "identified (exactly-once)" if meta.get("identified_writers") else "plain"
    console.print(f"duplicates: {report.counts['duplicates']}  (writers: {writers}; re-sent "
                  f"after an unknown outcome: {meta.get('identified_resent', 0)})")
    console.print(("[green]SAFE[/]" if report.safe else "[red]UNSAFE[/]") + f" seed={meta['config']['seed']}"
                  + (f"  (logs: {meta['workdir']})" if meta.get("workdir") else ""))


def command(
    duration: float = typer.Option(60.0, "--duration", min=10, help="Seconds of writes and faults."),
    seed: int = typer.Option(0, "--seed", help="Seed of the fault schedule and the writers."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the summary here."),
    coordinators: int = typer.Option(5, "--coordinators", min=3, max=5),
    journals: int = typer.Option(8, "--journals", min=1),
    writers: int = typer.Option(8, "--writers", min=1, help="Writer i appends to journals i, i+W, ..."),
    rate: float = typer.Option(250.0, "--rate", help="Appends per second, all writers."),
    lease_ttl: int = typer.Option(5, "--lease-ttl", help="Coordinator lease TTL (seconds)."),
    kinds: str = typer.Option("", "--kinds", help="Comma-separated fault kinds (default: all)."),
    history: Path | None = typer.Option(None, "--history", help="JSONL history (default next to --json)."),
    log_level: str = typer.Option("WARNING", "--log-level"),
    workdir: Path | None = typer.Option(
        None, "--workdir", help="The cluster's directory (logs, spools, etcd), kept as "
                                "evidence (default: a new /tmp/quire-cluster-*; a campaign "
                                "uses one seed-N/ inside it per seed)."),
    campaign: int = typer.Option(0, "--campaign", min=0,
                                 help="Run this many seeds (--seed, --seed+1, ...) one after another and print a table."),
    campaign_doc: Path | None = typer.Option(None, "--campaign-doc",
                                             help="Write the campaign table between the campaign markers of this doc."),
    campaign_dir: Path | None = typer.Option(None, "--campaign-dir",
                                             help="Write each seed's summary and history here."),
    identified: bool = typer.Option(True, "--identified/--plain",
                                    help="Exactly-once writers: every append carries a txn id and "
                                         "is re-sent until answered (docs/exactly-once.md)."),
    consumers: bool = typer.Option(True, "--consumers/--no-consumers",
                                   help="Run a consumer group (count shards, hot standbys) with "
                                        "kill-consumer / pause-consumer faults and check its "
                                        "committed counts against a model of its input."),
    consumer_members: int = typer.Option(3, "--consumer-members", min=1, max=5),
    consumer_shards: int = typer.Option(4, "--consumer-shards", min=1, max=16),
    consumer_rate: float = typer.Option(20.0, "--consumer-rate",
                                        help="Event appends per second to the consumers' "
                                             "sources (10 JSON lines each)."),
    hosts: int = typer.Option(0, "--hosts", min=0,
                              help="Run on simulated hosts (network namespaces; needs root): "
                                   "this many coordinator hosts over three zones, a "
                                   "three-member etcd on three more, S3/Redis, the worker "
                                   "and each consumer member on their own; faults at the "
                                   "network layer (chaos/net_faults.py)."),
) -> None:
    """Run a cluster under a seeded fault schedule while writers append; check the result."""
    configure_logging(format="console", level=log_level, stream=sys.stderr)
    cfg = ChaosConfig(duration=duration, seed=seed, coordinators=coordinators,
                      zones=("zone-a", "zone-b", "zone-c")[:max(2, min(3, coordinators - 1))],
                      journals=journals, writers=writers, rate=rate, lease_ttl=lease_ttl,
                      identified=identified, consumers=consumers,
                      consumer_members=consumer_members, consumer_shards=consumer_shards,
                      consumer_rate=consumer_rate, hosts=hosts,
                      workdir=str(workdir) if workdir else None,
                      history_path=str(history) if history else default_history_path(
                          str(json_out) if json_out else None))
    if kinds:
        try:
            cfg.kinds = tuple(FaultKind(k.strip()) for k in kinds.split(",") if k.strip())
        except ValueError as exc:
            raise typer.BadParameter(f"{exc}; kinds are {', '.join(k.value for k in FaultKind)}")
    _host_kinds(cfg, hosts, bool(kinds))
    if not consumers:
        cfg.kinds = tuple(k for k in cfg.kinds if k not in CONSUMER_KINDS)
    console = Console(width=150)
    if campaign:
        _campaign(cfg, campaign, campaign_doc, campaign_dir, console)
        return
    try:
        report, meta = bounded_run(run_chaos(cfg))
    except (ServiceError, RuntimeError, OSError) as exc:
        console.print(f"[red]chaos: the run could not be set up or checked:[/] {exc}")
        raise typer.Exit(2) from None
    render(report, meta, console)
    if json_out is not None:
        json_out.write_text(json.dumps({**report.to_json(), "run": meta}, indent=1, default=str))
    if not report.safe:
        raise typer.Exit(1)


def _host_kinds(cfg: ChaosConfig, hosts: int, chosen: bool) -> None:
    """With --hosts: coordinators = hosts, network-layer kinds by default; kinds that
    need a proxy or a single etcd process are refused (and the network-layer ones
    without --hosts)."""
    if not hosts:
        bad = [k.value for k in cfg.kinds if k in NET_LAYER_KINDS]
        if bad:
            raise typer.BadParameter(f"{', '.join(bad)} need --hosts")
        return
    from tools.hosts import available

    reason = available()
    if reason is not None:
        raise typer.BadParameter(f"--hosts: {reason}")
    if hosts < 3:
        raise typer.BadParameter(f"--hosts {hosts}: at least 3 (three zones)")
    cfg.coordinators = hosts
    cfg.zones = ("zone-a", "zone-b", "zone-c")
    if not chosen:
        cfg.kinds = NET_LAYER_KINDS + CONSUMER_KINDS
    bad = [k.value for k in cfg.kinds if k in PROXY_OR_SINGLE_ETCD]
    if bad:
        raise typer.BadParameter(f"{', '.join(bad)} cannot run with --hosts (no proxies, "
                                 f"etcd is three members: use the network-layer kinds)")
    bad = [k.value for k in cfg.kinds if k in DISK_KINDS]
    if bad:
        raise typer.BadParameter(f"{', '.join(bad)} cannot run with --hosts yet (the hosts' "
                                 f"spools are not on the fault-injecting filesystem)")


def _campaign(cfg: ChaosConfig, n: int, doc: Path | None, out_dir: Path | None,
              console: Console) -> None:
    import time

    from .campaign import describe, run_campaign, table, write_into

    seeds = list(range(cfg.seed, cfg.seed + n))
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    t0 = time.monotonic()
    rows = run_campaign(cfg, seeds, out_dir, progress=console.print)
    block = describe(cfg, seeds, started, time.monotonic() - t0) + "\n\n" + table(rows)
    console.print(block)
    if doc is not None:
        write_into(doc, block)
    if not all(r["safe"] for r in rows):
        raise typer.Exit(1)


def main() -> None:
    typer.run(command)


if __name__ == "__main__":
    main()
