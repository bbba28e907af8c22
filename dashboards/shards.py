"""Consumer shards for the live page: specs, primary locks and status reports, decoded
from the same etcd range read as the rest of the topology (topology/shards.py layout)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from protocol.shard import ShardSpec, ShardStatus
from topology.shards import primary_prefix, shards_prefix, status_prefix

__all__ = ["shard_rows"]


def shard_rows(root: str, kvs: Iterable[tuple[bytes, bytes]]) -> list[dict[str, Any]]:
    """One row per shard spec: state, primary, standbys, per-source offsets and lag."""
    specs: dict[str, ShardSpec] = {}
    locks: dict[str, str] = {}
    reports: dict[str, list[ShardStatus]] = {}
    sp, pp, tp = shards_prefix(root), primary_prefix(root), status_prefix(root)
    for raw_key, value in kvs:
        key = raw_key.decode(errors="replace")
        try:
            if key.startswith(sp):
                spec = msgspec.json.decode(value, type=ShardSpec)
                if spec.id == key[len(sp):]:
                    specs[spec.id] = spec
            elif key.startswith(pp):
                locks[key[len(pp):]] = value.decode(errors="replace")
            elif key.startswith(tp):
                st = msgspec.json.decode(value, type=ShardStatus)
                reports.setdefault(st.id, []).append(st)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
    rows = []
    for shard_id in sorted(specs):
        spec = specs[shard_id]
        primary = locks.get(shard_id)
        mine = reports.get(shard_id, [])
        lead = next((r for r in mine if r.member == primary), None)
        state = "DISABLED" if spec.disable else (lead.state.value if lead else "IDLE")
        rows.append({
            "id": shard_id,
            "labels": spec.labels.as_dict(),
            "state": state,
            "primary": primary,
            "standbys": [{"member": r.member, "state": r.state.value, "log_offset": r.log_offset}
                         for r in sorted(mine, key=lambda r: r.member) if r.member != primary],
            "sources": [{"journal": s.journal, "offset": s.offset, "write_head": s.write_head,
                         "lag": s.lag} for s in (lead.sources if lead else ())],
            "source_journals": sorted({s.journal for s in spec.sources if s.journal}),
            "recovery_log": spec.recovery_log,
            "log_offset": lead.log_offset if lead else None,
            "transactions": lead.transactions if lead else 0,
            "message": lead.message if lead else "",
        })
    return rows
