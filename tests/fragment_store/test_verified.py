"""The one verifying reader: a flipped byte never reaches the caller; another store's
copy is used, the rotten object quarantined and mended; without one, FragmentCorrupt."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest

from fragment_store import (
    FileStore,
    FragmentCorrupt,
    FragmentStore,
    fragment_key,
    persist_fragment,
    read_fragment,
    read_verified,
    verify_stored,
)
from fragment_store import verified as verified_mod
from protocol import Codec, Fragment

from .rot import ROT_CODECS, flip_byte

J = "logs/rot"


def data(n: int = 4000, seed: int = 7) -> bytes:
    rnd = random.Random(seed)
    return b"".join(b"%d,%s\n" % (i, rnd.randbytes(12).hex().encode()) for i in range(n))


def frag(content: bytes, codec: str) -> Fragment:
    return Fragment(journal=J, begin=100, end=100 + len(content),
                    sum=hashlib.sha1(content).hexdigest(), codec=Codec(codec))


def counter(metric, label: str) -> float:  # type: ignore[no-untyped-def]
    return metric.labels(label)._value.get()  # noqa: SLF001


@pytest.mark.parametrize("codec", ROT_CODECS)
def test_flipped_byte_never_reaches_the_caller(store: FragmentStore, codec: str) -> None:
    content = data()
    f = persist_fragment(store, frag(content, codec), content)
    key = fragment_key(f)
    rotten = flip_byte(store, key)
    before = counter(verified_mod.CORRUPT, store.url)
    got = b""
    with pytest.raises(FragmentCorrupt) as err:
        for chunk in read_fragment(store, f, 150):
            got += chunk
    assert got == b""  # not one byte before the proof
    assert err.value.journal == J and err.value.fragment in key and store.url in err.value.stores
    assert key.rsplit("/", 1)[1] in str(err.value)
    assert counter(verified_mod.CORRUPT, store.url) == before + 1
    # No good copy: kept where it is (later reads fail as loudly) and copied aside.
    assert store.read_all(key) == rotten
    assert store.read_all(verified_mod.quarantine_key(key)) == rotten


@pytest.mark.parametrize("codec", ROT_CODECS)
def test_good_copy_in_another_store_is_read_and_mends(store: FragmentStore, tmp_path: Path,
                                                       codec: str) -> None:
    content = data()
    backup = FileStore((tmp_path / "backup").as_uri() + "/")
    f = persist_fragment(store, frag(content, codec), content)
    persist_fragment(backup, f, content)
    key = fragment_key(f)
    rotten = flip_byte(store, key)
    mended = counter(verified_mod.MENDED, store.url)
    opened = {store.url: store, backup.url: backup}
    out = b"".join(read_verified(f, 100 + 17, stores=[store.url, backup.url],
                                 open_store=opened.__getitem__))
    assert out == content[17:]
    assert store.read_all(verified_mod.quarantine_key(key)) == rotten  # moved aside, then
    assert counter(verified_mod.MENDED, store.url) == mended + 1
    assert verify_stored(store, f) == ""  # the mended object proves itself again
    assert b"".join(read_fragment(store, f)) == content


def test_large_fragment_spills_to_disk_and_still_proves(tmp_path: Path) -> None:
    store = FileStore((tmp_path / "s").as_uri() + "/")
    content = data(20000)
    f = persist_fragment(store, frag(content, "zstd"), content)
    out = b"".join(read_verified(f, store=store, spill_bytes=4096, chunk=1000))
    assert out == content
    flip_byte(store, fragment_key(f))
    with pytest.raises(FragmentCorrupt):
        read_verified(f, store=store, spill_bytes=4096)


@pytest.mark.parametrize("codec", ["none", "gzip"])
def test_helper_thread_proof_holds_the_bound_and_spills_the_rest(tmp_path: Path, codec: str) -> None:
    """Past HASH_THREAD_BYTES a helper thread hashes and holds: the first spill_bytes stay
    in memory, the rest goes to the temp file; every offset reads back exactly."""
    from fragment_store.proof import HASH_THREAD_BYTES, prove_stored

    store = FileStore((tmp_path / "s").as_uri() + "/")
    content = data(90000)
    assert len(content) > 2 * HASH_THREAD_BYTES
    f = persist_fragment(store, frag(content, codec), content)
    held = prove_stored(store, f, spill_bytes=1 << 20)
    try:
        assert not held.in_memory and held.size == len(content)
        assert sum(len(c) for c in held._mem) <= 1 << 20  # noqa: SLF001
        for skip in (0, 5, (1 << 20) - 3, 1 << 20, (1 << 20) + 7, len(content) - 1, len(content)):
            assert b"".join(held.chunks(skip, 65536)) == content[skip:]
    finally:
        held.close()
    mid = f.begin + len(content) // 2
    assert b"".join(read_verified(f, mid, store=store, spill_bytes=1 << 20)) == content[mid - f.begin:]
    flip_byte(store, fragment_key(f), at=len(content) // 3)
    with pytest.raises(FragmentCorrupt):
        read_verified(f, store=store, spill_bytes=1 << 20)


def test_unverified_reads_risk_corruption(tmp_path: Path) -> None:
    store = FileStore((tmp_path / "s").as_uri() + "/")
    content = data()
    f = persist_fragment(store, frag(content, "none"), content)
    flip_byte(store, fragment_key(f), at=10)
    out = b"".join(read_verified(f, store=store, unverified_reads_risk_corruption=True))
    assert out != content and len(out) == len(content)  # what the option risks


def test_an_extra_source_serves_when_every_store_is_rotten(tmp_path: Path) -> None:
    store = FileStore((tmp_path / "s").as_uri() + "/")
    content = data()
    f = persist_fragment(store, frag(content, "gzip"), content)
    flip_byte(store, fragment_key(f))
    out = b"".join(read_verified(f, store=store, extra=[("spool", lambda: [content])]))
    assert out == content
    assert verify_stored(store, f) == ""  # mended from the spool's copy
