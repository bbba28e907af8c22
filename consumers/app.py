"""The application API: what `quire consumer run module:object` runs.

    class Counter(consumers.App):
        def handle(self, shard: consumers.Shard, msg: consumers.Message) -> None:
            key = msg.value["key"]
            n = int(shard.store.get(key, b"0")) + 1
            shard.store.put(key, str(n).encode())

An app:
- `decode(line)` turns one framed message (a JSON line by default) into a value; a
  FramingError/DecodeError skips the message (counted, logged once per shard);
- `handle(shard, msg)` reads and writes `shard.store` (the open transaction) and may
  `shard.publish(journal, data)` output messages;
- `before_commit(shard)` runs just before a transaction is committed (e.g. publish totals
  of the keys it touched), `on_commit(shard)` after it is durable;
- `init(shard)` once each time the shard becomes primary (after restore).

Every call happens on the shard's event loop: keep them quick and non-blocking.
Output messages are committed with the transaction (as intents in its write batch) and
appended only after it is durable, as exactly-once appends — one per output journal
per transaction, identified by the shard's producer name, generation, a history per
output journal and a txn number. A primary that dies before or while appending them is
succeeded by one that re-sends them and the broker drops those that had landed, so each
committed transaction's outputs are in their journals exactly once (outputs.py,
docs/exactly-once.md).
"""

from __future__ import annotations

import abc
import importlib
from dataclasses import dataclass, field
from typing import Any

import msgspec

from protocol.errors import ValidationError
from protocol.shard import ShardSpec

from .store import Store

__all__ = ["App", "Message", "Shard", "load_app"]


@dataclass(slots=True)
class Message:
    journal: str
    offset: int
    """Offset of the message's first byte in its journal."""
    value: Any
    """What `App.decode` returned."""
    raw: bytes


@dataclass
class Shard:
    """The app's handle on one shard while it is primary."""

    id: str
    spec: ShardSpec
    store: Store
    outputs: list[tuple[str, bytes]] = field(default_factory=list)
    """Messages published by the open transaction (appended after it commits)."""
    state: dict[str, Any] = field(default_factory=dict)
    """Scratch space for the app (not persisted: rebuild it in `init`)."""

    def publish(self, journal: str, data: bytes) -> None:
        if not data.endswith(b"\n"):
            data += b"\n"
        self.outputs.append((journal, data))


_json = msgspec.json.Decoder()


class App(abc.ABC):
    """Base class with the defaults; a subclass must define `handle` (instantiating one
    that does not is a TypeError, which `load_app` reports as a ValidationError)."""

    def decode(self, line: bytes) -> Any:
        return _json.decode(line)

    def init(self, shard: Shard) -> None:
        pass

    @abc.abstractmethod
    def handle(self, shard: Shard, msg: Message) -> None:
        """Read and write `shard.store`, publish with `shard.publish`; one message."""

    def before_commit(self, shard: Shard) -> None:
        pass

    def on_commit(self, shard: Shard) -> None:
        pass


def load_app(spec: str) -> App:
    """`module:object`: an App instance, an App subclass, or a factory returning one."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValidationError("app", f"{spec!r}: expected module:object")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValidationError("app", f"cannot import {module_name!r}: {exc}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValidationError("app", f"{module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    try:
        if isinstance(obj, type):
            obj = obj()
        elif not hasattr(obj, "handle") and callable(obj):
            obj = obj()
    except TypeError as exc:  # e.g. an App subclass without `handle`
        raise ValidationError("app", f"{spec!r}: cannot make the app: {exc}") from None
    if not callable(getattr(obj, "handle", None)):
        raise ValidationError("app", f"{spec!r} is not an App (it has no handle method)")
    for name, default in (("decode", App.decode), ("init", App.init),
                          ("before_commit", App.before_commit), ("on_commit", App.on_commit)):
        if not hasattr(obj, name):
            setattr(obj, name, default.__get__(obj))
    return obj
