"""Failover at scale (issue #49): kill -9 one coordinator of a cluster full of journals.

    python -m bench.scale --journals 10000 --failover

Run by `bench.scale` after its other phases, on the same cluster, every route full:

1. From etcd's assignments: the victim is the coordinator hosting the most replicas
   (~3N/5 at R=3 on five); `led` are the journals whose primary it is. A sample of
   SAMPLE journals, half of them led by the victim, gets appends from WRITERS tasks
   throughout: each record is `<journal> <seq>` padded to RECORD bytes, and each
   acknowledged one is remembered.
2. After WARMUP seconds of appends, the victim is sent SIGKILL (its process group).
3. Every second, from etcd: `primary_s`, until every journal it led has a primary on a
   live member; `full_s`, until every route of the N journals is full again with no
   assignment on the victim (its member lease, `lease_ttl_s`, has to expire first: that
   is when its assignments vanish). `resumed_s`: for each sampled journal it led, the
   first acknowledged append sent after the kill (the worst is reported).
4. Appends stop; each sampled journal is read back through the coordinators and every
   acknowledged record must be in it: `lost` counts those that are not (must be 0).
   `append_errors` counts appends that failed (a retry may have written them: those are
   indefinite, not acknowledged, and not counted as lost).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

from chaos.readback import final_read
from quire.client import Client
from topology.etcd import parse_assignment_key

from .scale_cluster import ROOT, ScaleCluster, etcd_assignments

__all__ = ["RECORD", "SAMPLE", "failover", "lost_records", "primaries"]

SAMPLE = 200
WRITERS = 16
RECORD = 128
WARMUP = 3.0


def primaries(assignments: list[tuple[str, bytes]], root: str = ROOT) -> tuple[dict[str, str], dict[str, int]]:
    """journal -> the member (its suffix) in slot 0, and member -> replicas it hosts."""
    primary: dict[str, str] = {}
    hosted: dict[str, int] = {}
    for key, _ in assignments:
        try:
            journal, member, slot = parse_assignment_key(root, key)
        except ValueError:
            continue
        hosted[member.suffix] = hosted.get(member.suffix, 0) + 1
        if slot == 0:
            primary[journal] = member.suffix
    return primary, hosted


def record(journal: str, seq: int) -> bytes:
    line = f"{journal} {seq}".encode()
    return line + b"." * (RECORD - 1 - len(line)) + b"\n"


def lost_records(acked: dict[str, list[int]], content: dict[str, bytes]) -> int:
    """Acknowledged records of each journal missing from its read-back content."""
    lost = 0
    for journal, seqs in acked.items():
        present = set(content.get(journal, b"").split(b"\n"))
        lost += sum(1 for s in seqs if record(journal, s)[:-1] not in present)
    return lost


async def failover(cluster: ScaleCluster, names: list[str], full_routes: Callable[..., set[str]],
                   replication: int, *, timeout: float, say: Callable[[str], None],
                   seed: int = 49) -> dict[str, Any]:
    out: dict[str, Any] = {"lease_ttl_s": cluster.lease_ttl}
    got = await asyncio.to_thread(etcd_assignments, cluster.etcd_url)
    primary, hosted = primaries(got)
    suffixes = [f"coordinator-{i}" for i in range(len(cluster.coordinators))]
    victim = max(suffixes, key=lambda s: hosted.get(s, 0))
    vi = suffixes.index(victim)
    led = sorted(j for j in names if primary.get(j) == victim)
    out.update(victim=victim, victim_replicas=hosted.get(victim, 0), victim_led=len(led))
    rng = random.Random(seed)
    others = [j for j in names if primary.get(j) != victim]
    sample = (rng.sample(led, min(len(led), SAMPLE // 2))
              + rng.sample(others, min(len(others), SAMPLE - min(len(led), SAMPLE // 2))))
    led_set = set(led)
    acked: dict[str, list[int]] = {j: [] for j in sample}
    resumed: dict[str, float] = {}
    errors = 0
    stop = asyncio.Event()
    t_kill: float | None = None
    client = Client(cluster.endpoints, retry_timeout=60)

    async def writer(k: int) -> None:
        nonlocal errors
        mine = sample[k::WRITERS]
        seq = 0
        while not stop.is_set() and mine:
            seq += 1
            for j in mine:
                if stop.is_set():
                    return
                sent = time.monotonic()
                try:
                    await asyncio.wait_for(client.append(j, record(j, seq)), 60)
                except Exception:  # noqa: BLE001 - indefinite: counted, not acknowledged
                    errors += 1
                    continue
                acked[j].append(seq)
                if t_kill is not None and sent >= t_kill and j in led_set and j not in resumed:
                    resumed[j] = time.monotonic() - t_kill

    writers = [asyncio.create_task(writer(k)) for k in range(WRITERS)]
    try:
        await asyncio.sleep(WARMUP)
        before = sum(len(v) for v in acked.values())
        t_kill = time.monotonic()
        await asyncio.to_thread(cluster.coordinators[vi].kill)
        say(f"failover: killed {victim} ({out['victim_replicas']} replicas, primary of "
            f"{len(led)}); {before} appends acknowledged before")
        want, out["primary_s"], out["full_s"] = set(names), None, None
        while time.monotonic() - t_kill < timeout:
            got = await asyncio.to_thread(etcd_assignments, cluster.etcd_url)
            now = time.monotonic() - t_kill
            primary, hosted = primaries(got)
            if out["primary_s"] is None and all(primary.get(j, victim) != victim for j in led):
                out["primary_s"] = now
            full = want & full_routes(got, replication)
            if hosted.get(victim, 0) == 0 and full == want:
                out["full_s"] = now
                break
            await asyncio.sleep(1.0)
        out["full_routes"] = len(full)
        # Let every sampled journal it led take an append after the kill (bounded).
        deadline = time.monotonic() + 30
        sampled_led = [j for j in sample if j in led_set]
        while len(resumed) < len(sampled_led) and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
    finally:
        stop.set()
        await asyncio.gather(*writers, return_exceptions=True)
    out["resumed"] = f"{len(resumed)}/{len(sampled_led)}"
    out["resumed_s_max"] = max(resumed.values()) if resumed else None
    out["acked"] = sum(len(v) for v in acked.values())
    out["append_errors"] = errors
    content: dict[str, bytes] = {}
    read_errors = 0
    try:
        for j in sample:
            rb = await final_read(client, j)
            if rb.read_error:
                read_errors += 1
            content[j] = rb.final
    finally:
        await client.close()
    out["read_errors"] = read_errors
    out["lost"] = lost_records(acked, content)
    say(f"failover: primaries of all {len(led)} after {out['primary_s']} s, every route "
        f"full after {out['full_s']} s (lease TTL {cluster.lease_ttl} s); sampled appends "
        f"resumed {out['resumed']} (worst {out['resumed_s_max']} s); {out['acked']} "
        f"acknowledged, {out['lost']} lost, {errors} failed, {read_errors} read errors")
    return out
