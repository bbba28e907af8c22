"""Consumer shards on the live page: rows decoded from etcd's key-values, scoped by token."""

from __future__ import annotations

import msgspec

from dashboards.shards import shard_rows
from protocol import LabelSet
from protocol.shard import ShardSource, ShardSpec, ShardState, ShardStatus, SourceStatus
from topology.shards import primary_key, shard_key, status_key
from protocol import ProcessId

ROOT = "/quire"


def test_shard_rows() -> None:
    a, b = ProcessId("za", "mem-a"), ProcessId("zb", "mem-b")
    spec = ShardSpec(id="counts-0", sources=(ShardSource(journal="src/part-0"),),
                     hot_standbys=1, labels=LabelSet.of(app="counts"))
    primary = ShardStatus(id="counts-0", member=str(a), state=ShardState.PRIMARY,
                          sources=(SourceStatus(journal="src/part-0", offset=70, write_head=100),),
                          log_offset=500, transactions=9)
    standby = ShardStatus(id="counts-0", member=str(b), state=ShardState.STANDBY, log_offset=480)
    kvs = [(shard_key(ROOT, "counts-0").encode(), msgspec.json.encode(spec)),
           (shard_key(ROOT, "idle-1").encode(), msgspec.json.encode(
               ShardSpec(id="idle-1", sources=(ShardSource(selector="topic=x"),), disable=True))),
           (shard_key(ROOT, "bad").encode(), b"{not json"),
           (primary_key(ROOT, "counts-0").encode(), str(a).encode()),
           (status_key(ROOT, "counts-0", a).encode(), msgspec.json.encode(primary)),
           (status_key(ROOT, "counts-0", b).encode(), msgspec.json.encode(standby)),
           (b"/quire/journals/src/part-0", b"{}")]
    rows = shard_rows(ROOT, kvs)
    assert [r["id"] for r in rows] == ["counts-0", "idle-1"]
    row = rows[0]
    assert row["state"] == "PRIMARY" and row["primary"] == str(a)
    assert row["standbys"] == [{"member": str(b), "state": "STANDBY", "log_offset": 480}]
    assert row["sources"] == [{"journal": "src/part-0", "offset": 70, "write_head": 100, "lag": 30}]
    assert row["recovery_log"] == "recovery/counts-0" and row["transactions"] == 9
    assert rows[1]["state"] == "DISABLED" and rows[1]["primary"] is None


def test_shards_are_scoped_by_the_token() -> None:
    from dashboards.access import visible_state
    from protocol.auth import Capability, Claims, Scope

    state = {"journals": [], "shards": [
        {"id": "a-1", "recovery_log": "team-a/recovery/a-1", "source_journals": ["team-a/src"]},
        {"id": "mixed", "recovery_log": "team-a/recovery/mixed", "source_journals": ["team-b/src"]}]}
    claims = Claims(subject="t", caps=Capability.READ, scope=Scope(prefixes=("team-a/",)),
                    issued_at=0, expires_at=2e9)
    assert [s["id"] for s in visible_state(state, claims)["shards"]] == ["a-1"]
