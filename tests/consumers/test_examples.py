"""The example apps over a real RocksDB store, transaction by transaction."""

from __future__ import annotations

import json

from consumers import Message, Shard, load_app
from consumers.examples.counts import Counts, read_counts
from consumers.examples.join import Join
from consumers.store import Store
from protocol import LabelSet
from protocol.shard import ShardSource, ShardSpec


def _shard(tmp_path, sources: tuple[str, ...]) -> Shard:  # noqa: ANN001
    spec = ShardSpec(id="ex-1", sources=tuple(ShardSource(journal=j) for j in sources),
                     labels=LabelSet.of(output="out/example"))
    return Shard(id=spec.id, spec=spec, store=Store(str(tmp_path / "db")))


def _commit(app, shard: Shard, offsets: dict[str, int], log_offset: int) -> list[dict]:  # noqa: ANN001
    app.before_commit(shard)
    shard.store.apply(shard.store.take(offsets), log_offset)
    out, shard.outputs = shard.outputs, []
    app.on_commit(shard)
    return [json.loads(line) for _, data in out for line in data.splitlines()]


def _msg(journal: str, offset: int, value: dict) -> Message:
    raw = json.dumps(value).encode() + b"\n"
    return Message(journal, offset, value, raw)


def test_counts_totals_and_outputs(tmp_path) -> None:  # noqa: ANN001
    app, shard = Counts(), _shard(tmp_path, ("src/aaaa",))
    app.init(shard)
    for i in range(10):
        app.handle(shard, _msg("src/aaaa", i * 10, {"key": "x" if i % 2 else "y"}))
    app.handle(shard, _msg("src/aaaa", 100, {"nokey": 1}))
    assert _commit(app, shard, {"src/aaaa": 110}, 1) == [
        {"shard": "ex-1", "key": "x", "count": 5}, {"shard": "ex-1", "key": "y", "count": 5}]
    app.handle(shard, _msg("src/aaaa", 110, {"key": "x"}))
    assert _commit(app, shard, {"src/aaaa": 120}, 2) == [{"shard": "ex-1", "key": "x", "count": 6}]
    assert read_counts(shard.store.items()) == {"x": 6, "y": 5}
    assert shard.store.offsets() == {"src/aaaa": 120} and shard.store.log_offset == 2


def test_join_keeps_state_in_the_store_across_transactions(tmp_path) -> None:  # noqa: ANN001
    app, shard = Join(), _shard(tmp_path, ("src/left", "src/right"))
    app.init(shard)
    app.handle(shard, _msg("src/left", 0, {"key": "k1", "order": 1}))
    assert _commit(app, shard, {"src/left": 10}, 1) == []
    # A fresh app instance (as after failover) finds the left side in the store.
    app2 = load_app("consumers.examples.join:Join")
    app2.init(shard)
    app2.handle(shard, _msg("src/right", 0, {"key": "k1", "ship": "a"}))
    app2.handle(shard, _msg("src/right", 10, {"key": "k2", "ship": "b"}))
    app2.handle(shard, _msg("src/left", 10, {"key": "k2", "order": 2}))
    out = _commit(app2, shard, {"src/left": 20, "src/right": 20}, 2)
    assert out == [{"key": "k1", "left": {"key": "k1", "order": 1}, "right": {"key": "k1", "ship": "a"}},
                   {"key": "k2", "left": {"key": "k2", "order": 2}, "right": {"key": "k2", "ship": "b"}}]
    assert shard.store.get("l/k1") is not None and shard.store.get("r/k2") is not None


def test_an_app_class_without_handle_is_refused_naming_the_app(monkeypatch) -> None:  # noqa: ANN001
    import sys
    import types

    import pytest

    from consumers.app import App
    from protocol.errors import ValidationError

    module = types.ModuleType("quire_test_apps")
    module.NoHandle = type("NoHandle", (App,), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "quire_test_apps", module)
    with pytest.raises(ValidationError, match="quire_test_apps:NoHandle.*cannot make the app"):
        load_app("quire_test_apps:NoHandle")
