"""A campaign: the same chaos run over N seeds, one row per seed, one table for the docs.

    quire chaos --campaign 20 --duration 300 --seed 1 --campaign-doc docs/reliability.md

Each seed is a whole `run_chaos` (its own cluster, schedule and writers), run one after
another (the machine has two cores). A row keeps what the issue asks for: seed,
appends acknowledged, faults by kind and per minute, every safety count (the consumer checker's included), the
consumer keys checked and shard primary changes, recovery after a primary kill (p50 / max), liveness after healing. `table()` renders the rows as
markdown and `write_into()` replaces the block between the campaign markers of a doc.
Row building and rendering are pure; `run_campaign` is the thin loop around them.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import time
from pathlib import Path
from typing import Any

from .bounded import run as bounded_run
from .checker import SAFETY_KEYS
from .runner import ChaosConfig, run_chaos

__all__ = ["BEGIN", "END", "row_of", "run_campaign", "table", "write_into"]

BEGIN, END = "<!-- campaign:begin -->", "<!-- campaign:end -->"

_SHORT = {"lost": "lost", "duplicates": "dup", "written_twice": "twice",
          "uncommitted_visible": "uncommitted", "divergence": "diverge",
          "bad_fragments": "bad frag", "consumer_mismatches": "c-mismatch",
          "consumer_overcounted": "c-over", "consumer_undercounted": "c-under",
          "consumer_dual_primaries": "c-dual", "consumer_zombie_commits": "c-zombie",
          "consumer_bad_offsets": "c-offset", "consumer_output_mismatches": "c-out",
          "consumer_output_duplicates": "c-out-dup"}


def row_of(seed: int, duration: float, summary: dict[str, Any], wall: float) -> dict[str, Any]:
    """One campaign row from a run's summary JSON (`Report.to_json()` + `run`). Pure."""
    faults: dict[str, int] = summary.get("faults", {})
    by_kind: dict[str, int] = {}
    for k, n in faults.items():
        kind = k.split(":", 1)[0]  # net-client:delay -> net-client
        by_kind[kind] = by_kind.get(kind, 0) + n
    total = sum(faults.values())
    rec = summary.get("recovery_after_primary_kill_s", {})
    counts = summary.get("counts", {})
    return {
        "seed": seed, "duration": duration, "wall": round(wall, 1),
        "safe": bool(summary.get("safe")),
        "acknowledged": summary.get("appends", {}).get("acknowledged", 0),
        "invoked": summary.get("appends", {}).get("invoked", 0),
        "faults": total, "faults_per_min": round(total * 60.0 / duration, 2) if duration else 0.0,
        "by_kind": dict(sorted(by_kind.items())),
        "safety": {k: summary.get("safety", {}).get(k, 0) for k in SAFETY_KEYS},
        "kills": rec.get("kills", 0), "recovered": rec.get("recovered", 0),
        "recovery_p50": rec.get("p50"), "recovery_max": rec.get("max"),
        "unavailable_after_heal": counts.get("unavailable_after_heal", 0),
        "stale_heads": counts.get("stale_heads", 0),
        "harness_stalls": counts.get("harness_stalls", 0),
        "caught_crashes": counts.get("caught_crashes", 0),
        "holes": counts.get("holes", 0),
        "consumer_keys": counts.get("consumer_keys", 0),
        "consumer_primary_changes": counts.get("consumer_primary_changes", 0),
        "skipped_faults": len(summary.get("run", {}).get("skipped_faults", []) or []),
        # `quire chaos --hosts`: the fault that takes a primary's host away (isolate-host,
        # kill-host) -> the first ok append on its journal invoked after it.
        "host_recovery": {kind: {k: r.get(k) for k in ("faults", "recovered", "p50", "max")}
                          for kind, r in ((summary.get("run") or {}).get("host_recovery")
                                          or {}).items()},
        "error": summary.get("error", ""),
    }


def _not_ok(r: dict[str, Any]) -> bool:
    """Liveness: a journal down after healing, a stale head, a harness wait that hit its
    bound (chaos/bounded.py), or an exception a coordinator caught (a bug)."""
    return bool(r["unavailable_after_heal"] or r["stale_heads"] or r.get("harness_stalls")
                or r.get("caught_crashes"))


def _s(v: float | None) -> str:
    return "—" if v is None else f"{v:.1f}"


def _host_kinds(rows: list[dict[str, Any]]) -> list[str]:
    return sorted({k for r in rows for k in (r.get("host_recovery") or {})})


def _host_cell(r: dict[str, Any], kind: str) -> str:
    h = (r.get("host_recovery") or {}).get(kind)
    if not h:
        return "—"
    return f"{_s(h['p50'])} / {_s(h['max'])} ({h['recovered']}/{h['faults']})"


def table(rows: list[dict[str, Any]], *, title: str = "") -> str:
    """Markdown: one line per seed, then the totals (with a column per host fault kind
    when the runs were on simulated hosts). Pure."""
    hosts = _host_kinds(rows)
    head = ["seed", "acked", "faults (/min)", "faults by kind",
            *(_SHORT[k] for k in SAFETY_KEYS), "holes", "c-keys / primary changes",
            "kill→ack p50 / max s", *(f"{k}→ack p50 / max s" for k in hosts), "liveness", "safe"]
    out = [f"**{title}**", ""] if title else []
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r.get("error"):
            out.append(f"| {r['seed']} | run failed: {r['error']} |" + " |" * (len(head) - 2))
            continue
        kinds = ", ".join(f"{k} {n}" for k, n in r["by_kind"].items())
        live = ("ok" if not _not_ok(r) else
                f"{r['unavailable_after_heal']} unavailable, {r['stale_heads']} stale"
                + (f", {r['harness_stalls']} harness stalls" if r.get("harness_stalls") else "")
                + (f", {r['caught_crashes']} caught crashes" if r.get("caught_crashes") else ""))
        out.append("| " + " | ".join([
            str(r["seed"]), f"{r['acknowledged']:,}", f"{r['faults']} ({r['faults_per_min']})", kinds,
            *(str(r["safety"][k]) for k in SAFETY_KEYS), str(r.get("holes", 0)),
            f"{r.get('consumer_keys', 0)} / {r.get('consumer_primary_changes', 0)}",
            f"{_s(r['recovery_p50'])} / {_s(r['recovery_max'])} ({r['recovered']}/{r['kills']})",
            *(_host_cell(r, k) for k in hosts), live, "yes" if r["safe"] else "**NO**"]) + " |")
    ok = [r for r in rows if not r.get("error")]
    if ok:
        maxes = [r["recovery_max"] for r in ok if r["recovery_max"] is not None]
        out.append("| **all** | " + " | ".join([
            f"{sum(r['acknowledged'] for r in ok):,}",
            f"{sum(r['faults'] for r in ok)} "
            f"({round(sum(r['faults'] for r in ok) * 60 / sum(r['duration'] for r in ok), 2)})",
            "",
            *(str(sum(r["safety"][k] for r in ok)) for k in SAFETY_KEYS),
            str(sum(r.get("holes", 0) for r in ok)),
            f"{sum(r.get('consumer_keys', 0) for r in ok)} / "
            f"{sum(r.get('consumer_primary_changes', 0) for r in ok)}",
            f"max {_s(max(maxes) if maxes else None)}",
            *(_host_total(ok, k) for k in hosts),
            f"{sum(1 for r in ok if _not_ok(r))} runs not ok",
            f"{sum(1 for r in ok if r['safe'])}/{len(rows)} safe"]) + " |")
    return "\n".join(out) + "\n"


def _host_total(rows: list[dict[str, Any]], kind: str) -> str:
    hs = [h for r in rows if (h := (r.get("host_recovery") or {}).get(kind))]
    maxes = [h["max"] for h in hs if h.get("max") is not None]
    return (f"max {_s(max(maxes) if maxes else None)} "
            f"({sum(h['recovered'] or 0 for h in hs)}/{sum(h['faults'] or 0 for h in hs)})")


def write_into(doc: Path, block: str) -> None:
    """Replace the text between the campaign markers of `doc` (append them if absent)."""
    text = doc.read_text() if doc.exists() else ""
    wrapped = f"{BEGIN}\n{block}{END}"
    if BEGIN in text and END in text:
        before, rest = text.split(BEGIN, 1)
        _, after = rest.split(END, 1)
        text = before + wrapped + after
    else:
        text = text.rstrip("\n") + "\n\n" + wrapped + "\n"
    doc.write_text(text)


def run_campaign(base: ChaosConfig, seeds: list[int], out_dir: Path | None = None,
                 progress: Any = print) -> list[dict[str, Any]]:
    """Run `base` once per seed, one after another; a row per seed (a run that could
    not be set up becomes a row with `error`, and the campaign goes on)."""
    rows: list[dict[str, Any]] = []
    for seed in seeds:
        history = str(out_dir / f"seed-{seed}.history.jsonl") if out_dir else None
        cfg = dataclasses.replace(base, seed=seed, history_path=history, workdir=str(
            Path(base.workdir) / f"seed-{seed}") if base.workdir else None)
        started = time.monotonic()
        try:
            report, meta = bounded_run(run_chaos(cfg))
            summary = {**report.to_json(), "run": meta}
        except Exception as exc:  # noqa: BLE001 - one broken run must not end the campaign
            summary = {"error": repr(exc)[:200]}
        wall = time.monotonic() - started
        if out_dir is not None:
            (out_dir / f"seed-{seed}.json").write_text(json.dumps(summary, indent=1, default=str))
        row = row_of(seed, cfg.duration, summary, wall)
        rows.append(row)
        progress(f"seed {seed}: safe={row['safe']} acked={row['acknowledged']} "
                 f"faults={row['faults']} ({row['faults_per_min']}/min) "
                 f"recovery max={row['recovery_max']} "
                 + "".join(f"{k} max={h['max']} ({h['recovered']}/{h['faults']}) "
                           for k, h in row["host_recovery"].items())
                 + f"wall={row['wall']}s {row['error']}")
    return rows


def describe(base: ChaosConfig, seeds: list[int], started_utc: str, wall: float) -> str:
    """The header line saying exactly what was run."""
    return (f"`quire chaos --campaign {len(seeds)} --seed {seeds[0]} --duration {base.duration:g}` "
            f"(seeds {seeds[0]}–{seeds[-1]}, {base.coordinators} coordinators, {base.journals} "
            f"journals R={base.replication}, {base.writers} writers at {base.rate:g} appends/s, "
            f"lease TTL {base.lease_ttl} s, "
            + (f"consumer group: {base.consumer_members} members, {base.consumer_shards} count "
               f"shards, {base.consumer_rate:g} event appends/s; " if base.consumers else
               "no consumers; ")
            + f"kinds: {', '.join(k.value for k in base.kinds)}); "
            f"started {started_utc}, {wall / 60:.0f} min wall on {platform.node() or 'this VM'} "
            f"({platform.machine()}, Python {platform.python_version()})")
