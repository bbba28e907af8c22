"""The Dask reader and the Spark batch source over rotten stores: no changed byte
becomes a row. With the good copies in another store (`fallbackStores`) every row is
right and the rotten objects are quarantined and mended; without, the read fails naming
the fragment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fragment_store import FileStore, FragmentCorrupt, fragment_key, fragment_name, verify_stored
from fragment_store.verified import quarantine_key
from tests.fragment_store.rot import ROT_CODECS, flip_byte
from tests.spark.batch_corpus import StoreUnderTest, expected_messages, json_lines, persist_journal
from tests.spark.test_batch_dask import dask_messages

J = "rot/journal"


def rotten_journal(sut: StoreUnderTest, backup: FileStore, codecs: tuple[str, ...]) -> tuple[bytes, list]:
    """A journal of 3 fragments per codec in `sut`, copies in `backup`; one byte of each
    stored object in `sut` flipped. Returns the content and the fragments."""
    import random

    content = json_lines(random.Random(3), 300)
    cuts = [content.index(b"\n", len(content) * k // (3 * len(codecs))) + 1
            for k in range(1, 3 * len(codecs))]
    frags = persist_journal(sut.store(), J, content, cuts, codecs)
    persist_journal(backup, J, content, cuts, codecs)
    for f in frags:
        flip_byte(sut.store(), fragment_key(f))
    return content, frags


@pytest.mark.parametrize("codec", ROT_CODECS)
def test_dask_reads_good_copies_and_mends(any_store: StoreUnderTest, tmp_path: Path, codec: str) -> None:
    backup = FileStore((tmp_path / "backup").as_uri() + "/")
    content, frags = rotten_journal(any_store, backup, (codec,))
    got = dask_messages(any_store, journal=J, fallbackStores=backup.url)
    assert got == {J: expected_messages(content)}
    store = any_store.store()
    for f in frags:
        assert store.exists(quarantine_key(fragment_key(f)))
        assert verify_stored(store, f) == ""


def test_dask_without_a_good_copy_fails_naming_the_fragment(file_store: StoreUnderTest,
                                                            tmp_path: Path) -> None:
    backup = FileStore((tmp_path / "backup").as_uri() + "/")
    content, frags = rotten_journal(file_store, backup, ROT_CODECS)
    with pytest.raises(FragmentCorrupt) as err:
        dask_messages(file_store, journal=J)
    assert err.value.journal == J
    assert err.value.fragment in {fragment_name(f) for f in frags}
    # Unproven reads are possible only by saying what they risk: the raw fragment's
    # rotten byte becomes a row (the compressed ones' own checks stop a read first).
    risky = dask_messages(file_store, journal=J, unverifiedReadsRiskCorruption="true",
                          end=frags[0].end)
    assert risky != {J: expected_messages(content, 0, frags[0].end)}


@pytest.mark.spark
def test_spark_batch_reads_good_copies_or_fails(quire_spark: Any, file_store: StoreUnderTest,
                                                tmp_path: Path) -> None:
    from tests.spark.test_batch_spark import spark_messages

    backup = FileStore((tmp_path / "backup").as_uri() + "/")
    content, frags = rotten_journal(file_store, backup, ROT_CODECS)
    with pytest.raises(Exception) as err:  # noqa: PT011 - Spark wraps the executor's error
        spark_messages(quire_spark, file_store, journal=J)
    assert "FragmentCorrupt" in str(err.value) and J in str(err.value)
    assert any(fragment_name(f) in str(err.value) for f in frags)
    got = spark_messages(quire_spark, file_store, journal=J, fallbackStores=backup.url)
    assert got == {J: expected_messages(content)}
    store = file_store.store()
    assert all(verify_stored(store, f) == "" for f in frags)
