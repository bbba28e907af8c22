"""The compiled modules' own work, timed alone: pure Python, mypyc (and Cython), a process each.

    python -m bench.native_micro [--n 2000] [--repeat 40] [--rounds 3] [--cython DIR]

What `bench.cpu` cannot resolve on a shared machine (the compiled code is a slice of
each process's CPU; the event loop, the sockets and the uncompiled replicate path are
the rest): the calls an append makes into the compiled set, each loop timed `--repeat`
times in a fresh interpreter per arm, the arms alternating for `--rounds`, and the best
of all kept (the least disturbed by other work: no hardware counters on this VM; short
loops, so that some run undisturbed). `--cython DIR` adds the Cython build of
`tools.native_build --compiler cython --out DIR`. Prints µs per call per arm and the
speed-ups; docs/compiled.md has the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from protocol import native

CASES = r"""
import json, sys, time
from protocol import AppendChunk, AppendRequest, AppendResponse, Status
from protocol.wire import FrameDecoder, FrameTemplate, check_prefix, encode_frame
from protocol.native import HOT_PATH
from coordinator.spool import Spool
from coordinator.spool_files import MemoryFiles
from quire.client.routes import RouteCache

n, repeat = int(sys.argv[1]), int(sys.argv[2])
req = AppendRequest(journal="bench/micro", route_revision=7, min_etcd_revision=3)
resp = AppendResponse(status=Status.OK)
chunk = FrameTemplate(AppendChunk())
payload = b"x" * 1024
wire = b"".join(encode_frame(resp)) * 4

def encode():
    for _ in range(n):
        encode_frame(req)
        chunk.encode(payload)

def decode():
    for _ in range(n // 4):
        d = FrameDecoder()
        d.feed(wire)
        for _f in d.frames():
            pass

def prefix():
    head = bytes(encode_frame(req)[0][:9])
    for _ in range(n):
        check_prefix(head)

def spool():
    s = Spool("bench/micro", files=MemoryFiles())
    for _ in range(n):
        s.apply_content(s.delta, payload)
        s.apply(s.commit_proposal(), primary=True)

def routes():
    r = RouteCache(["127.0.0.1:1", "127.0.0.1:2"])
    for _ in range(n):
        r.for_append("bench/micro")
        r.revision("bench/micro")
        r.primary("bench/micro")

out = {"hot_path": HOT_PATH.describe()}
for name, fn in [("encode_frame+chunk", encode), ("FrameDecoder (per frame)", decode),
                 ("check_prefix", prefix), ("spool apply+commit 1 KiB", spool),
                 ("route lookups", routes)]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    out[name] = min(times) / n * 1e6
print(json.dumps(out))
"""


def _arm(arm: str, n: int, repeat: int, cython_dir: str | None) -> dict[str, float | str]:
    env = {k: v for k, v in os.environ.items() if k not in (native.ENV_PURE, native.ENV_DIR)}
    if arm == "pure":
        env[native.ENV_PURE] = "1"
    elif arm == "cython":
        env[native.ENV_DIR] = str(cython_dir)
    out = subprocess.run([sys.executable, "-c", CASES, str(n), str(repeat)], env=env,
                         capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600)
    if out.returncode:
        raise SystemExit(f"the {arm} arm failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.native_micro")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cython", metavar="DIR")
    args = ap.parse_args(argv)
    arms = ["pure", "mypyc"] + (["cython"] if args.cython else [])
    best: dict[str, dict[str, float]] = {a: {} for a in arms}
    for _ in range(args.rounds):
        for arm in arms:
            got = _arm(arm, args.n, args.repeat, args.cython)
            how = str(got.pop("hot_path"))
            if not how.startswith("pure" if arm == "pure" else f"compiled ({arm}"):
                raise SystemExit(f"the {arm} arm ran {how}")
            for name, us in got.items():
                best[arm][name] = min(float(us), best[arm].get(name, float("inf")))
    print("µs per call (best of all runs), speed-up against pure Python")
    for name, us in best["pure"].items():
        cells = "".join(f"  {a} {best[a][name]:6.3f} ({us / best[a][name]:4.2f}×)" for a in arms[1:])
        print(f"{name:26} pure {us:6.3f}{cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
