"""Spool apply throughput against raw hashlib.sha1 on the same bytes, in the same run.

    python -m bench.spool [--json OUT] [--mib 512] [--repeat 3]

For each chunk size (64 KiB, 1 MiB) it appends `--mib` MiB through a real on-disk
Spool (content chunk + commit proposal per chunk, rolling at the fragment length like a
live journal) and hashes the same chunks with a bare `hashlib.sha1`. The figure that
matters is `ratio_to_sha1` = spool MB/s / sha1 MB/s (best of `--repeat` each; the
runs alternate sha1 / spool so both see the same machine load). The spool is the
production one (DiskFiles with its recycle pool, as coordinator/server.py builds it);
`cold_ratio` is the same spool with the recycle pool off, for reference.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time

from bench.common import write_json
from coordinator.spool import DiskFiles, Spool
from protocol import Codec, Fragment, ReplicateContent

FRAGMENT_LENGTH = 1 << 26
"""64 MiB: several rolls per measurement, as a live journal has."""


class _Discard:
    """Closed fragments are dropped at once, as if persisted instantly."""

    def on_commit(self, spool, fragment, primary):  # noqa: ANN001
        pass

    def on_closed(self, spool, fragment, file, primary):  # noqa: ANN001
        if file is not None:
            file.discard()


def _sha1_run(chunks: list[bytes], total: int) -> float:
    h = hashlib.sha1()
    n = 0
    start = time.perf_counter()
    while n < total:
        for c in chunks:
            h.update(c)
        n += sum(map(len, chunks))
    h.hexdigest()
    return n / (time.perf_counter() - start)


def _spool_run(chunks: list[bytes], total: int, files: DiskFiles) -> float:
    spool = Spool("bench/spool", files=files, observer=_Discard(), codec=Codec.NONE)
    n = 0
    start = time.perf_counter()
    while n < total:
        for c in chunks:
            spool.apply_content(0, c)
            spool.apply_proposal(spool.commit_proposal())
            if spool.content_length >= FRAGMENT_LENGTH:
                spool.apply_proposal(spool.roll_proposal())
        n += sum(map(len, chunks))
    spool.close()
    return n / (time.perf_counter() - start)


def measure(chunk: int, mib: int, repeat: int) -> dict[str, float | int]:
    chunks = [os.urandom(chunk) for _ in range(max(1, (8 << 20) // chunk))]
    total = mib << 20
    with tempfile.TemporaryDirectory(prefix="quire-bench-spool-") as root:
        # Cold: every fragment in a brand-new file (a journal's first fragments, or
        # persistence lagging so no closed file has been released yet).
        cold_files = DiskFiles(root + "/cold", recycle=0)
        # Steady state: closed fragments are persisted and their files recycled.
        files = DiskFiles(root + "/warm")
        _spool_run(chunks, total, files)  # fills the free pool, as a running broker has
        sha, spool, cold = [], [], []
        for _ in range(repeat):  # interleaved: each kind sees the same machine load
            sha.append(_sha1_run(chunks, total))
            spool.append(_spool_run(chunks, total, files))
            cold.append(_spool_run(chunks, total, cold_files))
        files.close()
    best = max(sha)
    return {"chunk_bytes": chunk, "bytes": total, "sha1_mb_s": round(best / 1e6, 1),
            "spool_mb_s": round(max(spool) / 1e6, 1), "ratio_to_sha1": round(max(spool) / best, 3),
            "paired_ratios": [round(b / a, 3) for a, b in zip(sha, spool)],
            "cold_spool_mb_s": round(max(cold) / 1e6, 1), "cold_ratio_to_sha1": round(max(cold) / best, 3),
            "load_avg_1m": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.spool", description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="OUT", help="also write results as JSON here ('-' = stdout)")
    ap.add_argument("--mib", type=int, default=512, help="MiB appended per measurement")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    results = [measure(64 << 10, args.mib, args.repeat), measure(1 << 20, args.mib, args.repeat)]
    for r in results:
        print(f"chunk {r['chunk_bytes'] >> 10:>5} KiB: spool {r['spool_mb_s']:>7.1f} MB/s, "
              f"sha1 {r['sha1_mb_s']:>7.1f} MB/s, ratio_to_sha1 {r['ratio_to_sha1']:.3f} "
              f"(paired {r['paired_ratios']}; "
              f"cold files {r['cold_ratio_to_sha1']:.3f}; load {r['load_avg_1m']:.1f})")
    out = {"benchmark": "spool", "results": results,
           "ratio_to_sha1": results[-1]["ratio_to_sha1"]}
    if args.json == "-":
        json.dump(out, sys.stdout, indent=2)
    else:
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
