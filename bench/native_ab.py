"""A/B of the hot path's builds in `bench.cpu`: pure Python, mypyc, and Cython if built.

    python -m bench.native_ab [--pairs 3] [--seconds 4] [--journals 1] [--cython DIR]
                              [--before TREE] [--arms pure,mypyc,...] [--json OUT]

Runs `python -m bench.cpu --rounds 1` once per arm per pair, the arms alternating
(pure, mypyc, cython, pure, ...), each in its own processes (the coordinators inherit
the arm's environment: `QUIRE_PURE_PYTHON=1`, or `QUIRE_NATIVE_DIR` for Cython's
build from `python -m tools.native_build --compiler cython --out DIR`). `--before TREE`
adds the arm "before": another checkout of quire (e.g. a `git archive` of the base
commit, its own compiled set built in TREE/build/native) whose bench.cpu and
coordinators run from TREE — this tree's compiled set against another one. `--arms`
picks and orders the arms. Prints, per arm, the medians over its runs of appends/s, the
CPU per append of quire's client, primary, replicas (the other coordinators) and in
all (µs, from /proc), and the ratio to the reference pipeline measured in the same run
(bench.cpu's own, with the reference's own total), with the 1-minute load average;
docs/compiled.md has the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from protocol import native


def _arm_env(arm: str, args: argparse.Namespace) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (native.ENV_PURE, native.ENV_DIR)}
    if arm == "pure":
        env[native.ENV_PURE] = "1"
    elif arm == "cython":
        assert args.cython is not None
        env[native.ENV_DIR] = args.cython
    elif arm == "before":
        assert args.before is not None
        env["PYTHONPATH"] = args.before
    return env


def _one(arm: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.cpu", "--rounds", "1", "--seconds", str(args.seconds),
           "--size", str(args.size), "--conc", str(args.conc), "--journals", str(args.journals),
           "--json", str(out)]
    subprocess.run(cmd, env=_arm_env(arm, args), check=True, stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, timeout=600,
                   cwd=args.before if arm == "before" else None)
    r = json.loads(out.read_text())["rounds"][0]
    q, p = r["quire"], r["pipeline"]
    cpu = q["cpu_us_per_append"]
    primary = max((v for k, v in cpu.items() if k == "primary" or k.startswith("coord-")), default=0.0)
    return {"ops_per_s": q["ops_per_s"], "client_us": cpu["client"], "primary_us": primary,
            "replicas_us": round(cpu["total"] - cpu["client"] - primary, 1), "total_us": cpu["total"],
            "ratio": q["ratio_vs_pipeline"],
            "pipeline_total_us": p["cpu_us_per_append"]["total"], "load": q["load_avg_1m"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.native_ab")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--conc", type=int, default=64)
    ap.add_argument("--journals", type=int, default=1)
    ap.add_argument("--cython", metavar="DIR", help="a Cython build (tools.native_build --compiler cython --out DIR)")
    ap.add_argument("--before", metavar="TREE", help="another checkout, its compiled set built (arm 'before')")
    ap.add_argument("--arms", help="comma-separated, in order (default: pure,mypyc[,cython][,before])")
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args(argv)
    if args.before:
        args.before = str(Path(args.before).resolve())
    arms = (args.arms.split(",") if args.arms else
            ["pure", "mypyc"] + (["cython"] if args.cython else []) + (["before"] if args.before else []))
    for arm in arms:
        if arm not in ("pure", "mypyc", "cython", "before") or (arm == "cython" and not args.cython) \
                or (arm == "before" and not args.before):
            raise SystemExit(f"unknown arm {arm!r} (pure, mypyc; cython needs --cython, before --before)")
    if "mypyc" in arms and not native.check_build(native.build_dir())[0]:
        raise SystemExit(f"no current mypyc build in {native.build_dir()}: run make compiled first")
    for arm in arms:  # what each arm's processes run (a silently pure arm would mislead)
        said = subprocess.run([sys.executable, "-c", "from protocol import native; "
                               "print(native.HOT_PATH.describe())"], env=_arm_env(arm, args),
                              cwd=args.before if arm == "before" else None, check=True,
                              capture_output=True, text=True, timeout=60).stdout.strip()
        print(f"{arm:6}: hot path {said}", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    with tempfile.TemporaryDirectory(prefix="quire-native-ab-") as tmp:
        for i in range(args.pairs):
            for arm in arms:
                res = _one(arm, args, Path(tmp) / f"{arm}-{i}.json")
                runs[arm].append(res)
                print(f"pair {i + 1} {arm:6}: {res['ops_per_s']:>9,.0f}/s  client {res['client_us']:5.1f}  "
                      f"primary {res['primary_us']:5.1f}  replicas {res['replicas_us']:5.1f}  "
                      f"total {res['total_us']:6.1f} µs  "
                      f"(pipeline {res['pipeline_total_us']:6.1f})  ratio {res['ratio']}  "
                      f"load {res['load']:.1f}", flush=True)
    summary = {}
    for arm, rs in runs.items():
        summary[arm] = {k: round(statistics.median(r[k] for r in rs), 3)
                        for k in ("ops_per_s", "client_us", "primary_us", "replicas_us", "total_us",
                                  "ratio", "pipeline_total_us", "load")}
        m = summary[arm]
        print(f"median {arm:6}: {m['ops_per_s']:>9,.0f}/s  client {m['client_us']:5.1f}  "
              f"primary {m['primary_us']:5.1f}  replicas {m['replicas_us']:5.1f}  total {m['total_us']:6.1f} µs  "
              f"(pipeline {m['pipeline_total_us']:6.1f})  ratio {m['ratio']}  load {m['load']:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "median": summary}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
