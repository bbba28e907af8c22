"""Consumer shards (layer 4 role): stateful processing of journals.

    app        App, Shard, Message: the application API (`quire consumer run module:object`)
    plan       pure: shard placement over members, member steps, lifecycle, commit policy
    store      RocksDB store with a transaction overlay (state + offsets in one batch)
    recoverylog  the recovery-log record format, fencing, replay
    snapshot   store snapshots in the fragment store
    runner     one shard as primary or hot standby (asyncio adapter)
    member     a member: membership, locks, status reports (asyncio adapter)
    examples   counts (per-key totals to an output journal) and a stream-stream join

Imports protocol/, fragment_store/, quire/ and topology/ only (docs/architecture.md).
"""

from .app import App, Message, Shard, load_app

__all__ = ["App", "Message", "Shard", "load_app"]
