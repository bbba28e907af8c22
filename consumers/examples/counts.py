"""Event count per key, with totals written to an output journal.

    quire consumer run consumers.examples.counts:Counts --etcd … --zone a --id m-1

Input: JSON lines with a "key" field (other fields ignored). State: one store entry per
key, `c/<key>` -> decimal count. On every commit the new totals of the keys the
transaction touched are published as `{"shard", "key", "count"}` lines to the journal
named by the shard's `output` label (no label: nothing is published). A reader of the
output journal takes the last line per (shard, key) as the current total.
"""

from __future__ import annotations

import msgspec

from consumers import App, Message, Shard

_enc = msgspec.json.Encoder()


class Counts(App):
    def init(self, shard: Shard) -> None:
        shard.state["dirty"] = {}
        shard.state["output"] = shard.spec.labels.value("output")

    def handle(self, shard: Shard, msg: Message) -> None:
        try:
            skey = "c/" + str(msg.value["key"])
        except (KeyError, TypeError):
            return  # not a keyed JSON object: not counted
        dirty = shard.state["dirty"]
        n = dirty.get(skey)
        if n is None:
            raw = shard.store.get(skey)
            n = int(raw) if raw is not None else 0
        dirty[skey] = n + 1
        # The store is written once per key per transaction (before_commit), not per message.

    def before_commit(self, shard: Shard) -> None:
        dirty = shard.state["dirty"]
        for k, n in dirty.items():
            shard.store.put(k, b"%d" % n)
        output = shard.state["output"]
        if output and dirty:
            lines = b"".join(_enc.encode({"shard": shard.id, "key": k[2:], "count": n}) + b"\n"
                             for k, n in sorted(dirty.items()))
            shard.publish(output, lines)
        shard.state["dirty"] = {}


def read_counts(store_items) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """{key: count} from a store's committed items (tests, tools)."""
    return {k[2:].decode(): int(v) for k, v in store_items if k.startswith(b"c/")}
