"""Store snapshots in the fragment store: a RocksDB checkpoint, tarred, with its log offset.

Key: `.quire/snapshots/<shard id>/<log offset:016x>.tar.gz` in the recovery log's first
store (`.quire/` is quire's own namespace: no journal may shadow it, and the fragment
index never lists it). Restore = the newest snapshot + a replay of the recovery log
from its offset, so snapshots bound replay time. Blocking functions: call them from a
thread.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile

from fragment_store import open_store

__all__ = ["fetch_snapshot", "latest_snapshot", "prune_snapshots", "snapshot_prefix", "upload_snapshot"]

KEEP = 2


def snapshot_prefix(shard_id: str) -> str:
    return f".quire/snapshots/{shard_id}/"


def _offset_of(key: str) -> int | None:
    name = key.rsplit("/", 1)[-1]
    if not name.endswith(".tar.gz"):
        return None
    try:
        return int(name[: -len(".tar.gz")], 16)
    except ValueError:
        return None


def list_snapshots(store_url: str, shard_id: str) -> list[tuple[int, str]]:
    store = open_store(store_url)
    out = []
    for info in store.list(snapshot_prefix(shard_id)):
        offset = _offset_of(info.key)
        if offset is not None:
            out.append((offset, info.key))
    return sorted(out)


def latest_snapshot(store_url: str, shard_id: str) -> tuple[int, str] | None:
    snaps = list_snapshots(store_url, shard_id)
    return snaps[-1] if snaps else None


def upload_snapshot(store_url: str, shard_id: str, checkpoint_dir: str, log_offset: int) -> str:
    """Tar and upload a checkpoint directory; returns its key. Removes the directory."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        tar.add(checkpoint_dir, arcname="db")
    shutil.rmtree(checkpoint_dir, ignore_errors=True)
    key = f"{snapshot_prefix(shard_id)}{log_offset:016x}.tar.gz"
    data = buf.getvalue()
    open_store(store_url).put(key, data, len(data))
    return key


def prune_snapshots(store_url: str, shard_id: str, keep: int = KEEP) -> None:
    snaps = list_snapshots(store_url, shard_id)
    store = open_store(store_url)
    for _, key in snaps[:-keep] if keep else snaps:
        store.delete(key)


def fetch_snapshot(store_url: str, key: str, target: str) -> None:
    """Download and unpack a snapshot as the RocksDB directory `target` (replaced)."""
    data = open_store(store_url).read_all(key)
    parent = os.path.dirname(os.path.abspath(target))
    os.makedirs(parent, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=parent) as tmp:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            tar.extractall(tmp, filter="data")
        if os.path.exists(target):
            shutil.rmtree(target)
        os.replace(os.path.join(tmp, "db"), target)
