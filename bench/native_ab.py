"""A/B of the hot path's builds in `bench.cpu`: pure Python, mypyc, and Cython if built.

    python -m bench.native_ab [--pairs 3] [--seconds 4] [--journals 1] [--cython DIR] [--json OUT]

Runs `python -m bench.cpu --rounds 1` once per arm per pair, the arms alternating
(pure, mypyc, cython, pure, ...), each in its own processes (the coordinators inherit
the arm's environment: `QUIRE_PURE_PYTHON=1`, or `QUIRE_NATIVE_DIR` for Cython's
build from `python -m tools.native_build --compiler cython --out DIR`). Prints, per arm,
the medians over its runs of appends/s, the CPU per append of quire's client, primary and
in all (µs, from /proc), and the ratio to the reference pipeline measured in the same run
(bench.cpu's own), with the 1-minute load average; docs/compiled.md has the figures.
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


def _arm_env(arm: str, cython_dir: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (native.ENV_PURE, native.ENV_DIR)}
    if arm == "pure":
        env[native.ENV_PURE] = "1"
    elif arm == "cython":
        assert cython_dir is not None
        env[native.ENV_DIR] = cython_dir
    return env


def _one(arm: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.cpu", "--rounds", "1", "--seconds", str(args.seconds),
           "--size", str(args.size), "--conc", str(args.conc), "--journals", str(args.journals),
           "--json", str(out)]
    subprocess.run(cmd, env=_arm_env(arm, args.cython), check=True, stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, timeout=600)
    r = json.loads(out.read_text())["rounds"][0]
    q, p = r["quire"], r["pipeline"]
    cpu = q["cpu_us_per_append"]
    primary = max((v for k, v in cpu.items() if k == "primary" or k.startswith("coord-")), default=0.0)
    return {"ops_per_s": q["ops_per_s"], "client_us": cpu["client"], "primary_us": primary,
            "total_us": cpu["total"], "ratio": q["ratio_vs_pipeline"],
            "pipeline_total_us": p["cpu_us_per_append"]["total"], "load": q["load_avg_1m"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.native_ab")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--conc", type=int, default=64)
    ap.add_argument("--journals", type=int, default=1)
    ap.add_argument("--cython", metavar="DIR", help="a Cython build (tools.native_build --compiler cython --out DIR)")
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args(argv)
    arms = ["pure", "mypyc"] + (["cython"] if args.cython else [])
    if not native.check_build(native.build_dir())[0]:
        raise SystemExit(f"no current mypyc build in {native.build_dir()}: run make compiled first")
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    with tempfile.TemporaryDirectory(prefix="quire-native-ab-") as tmp:
        for i in range(args.pairs):
            for arm in arms:
                res = _one(arm, args, Path(tmp) / f"{arm}-{i}.json")
                runs[arm].append(res)
                print(f"pair {i + 1} {arm:6}: {res['ops_per_s']:>9,.0f}/s  client {res['client_us']:5.1f}  "
                      f"primary {res['primary_us']:5.1f}  total {res['total_us']:6.1f} µs  "
                      f"(pipeline {res['pipeline_total_us']:6.1f})  ratio {res['ratio']}  "
                      f"load {res['load']:.1f}", flush=True)
    summary = {}
    for arm, rs in runs.items():
        summary[arm] = {k: round(statistics.median(r[k] for r in rs), 3)
                        for k in ("ops_per_s", "client_us", "primary_us", "total_us", "ratio", "load")}
        m = summary[arm]
        print(f"median {arm:6}: {m['ops_per_s']:>9,.0f}/s  client {m['client_us']:5.1f}  "
              f"primary {m['primary_us']:5.1f}  total {m['total_us']:6.1f} µs  ratio {m['ratio']}  "
              f"load {m['load']:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "median": summary}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
