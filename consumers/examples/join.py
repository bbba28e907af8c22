"""Stream-stream join: messages of two sources with equal "key", joined as they arrive.

The shard's first source is the left side, every other source the right side. Each
message is kept in the store (`l/<key>` / `r/<key>`: a JSON list of the side's values
for that key, at most `MAX_PER_KEY` newest) and joined with every stored message of the
other side; each pair is published as `{"key", "left", "right"}` to the journal named
by the shard's `output` label. The join state lives in the store, so it survives
failover (restored from snapshot + recovery log) like any other shard state.
"""

from __future__ import annotations

import msgspec

from consumers import App, Message, Shard

MAX_PER_KEY = 100
_enc = msgspec.json.Encoder()
_dec = msgspec.json.Decoder(list)


class Join(App):
    def init(self, shard: Shard) -> None:
        first = shard.spec.sources[0]
        shard.state["left"] = first.journal
        shard.state["output"] = shard.spec.labels.value("output")

    def handle(self, shard: Shard, msg: Message) -> None:
        if not isinstance(msg.value, dict) or "key" not in msg.value:
            return
        key = str(msg.value["key"])
        left = msg.journal == shard.state["left"]
        mine, other = ("l/", "r/") if left else ("r/", "l/")
        raw = shard.store.get(other + key)
        output = shard.state["output"]
        if raw is not None and output:
            for match in _dec.decode(raw):
                pair = (msg.value, match) if left else (match, msg.value)
                shard.publish(output, _enc.encode({"key": key, "left": pair[0], "right": pair[1]}))
        kept = shard.store.get(mine + key)
        values = _dec.decode(kept) if kept is not None else []
        values.append(msg.value)
        shard.store.put(mine + key, _enc.encode(values[-MAX_PER_KEY:]))
