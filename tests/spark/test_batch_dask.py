"""The Dask reader over both stores: same plan, same bytes (no JVM)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.spark.batch_corpus import Corpus, StoreUnderTest, build_corpus, expected_messages
from spark.dask_reader import fragment_index, read_bag, read_journals
from spark.options import OptionError


def dask_messages(sut: StoreUnderTest, **options: Any) -> dict[str, list[tuple[int, bytes]]]:
    pdf = read_journals(sut.url, **sut.dask_options(), **options).compute(scheduler="threads")
    out: dict[str, list[tuple[int, bytes]]] = {}
    for row in pdf.sort_values(["journal", "offset"]).itertuples():
        out.setdefault(row.journal, []).append((row.offset, row.value.encode()))
    return out


def expected(corpus: Corpus, begin: int = 0, end: int | None = None,
             prefix: str = "") -> dict[str, list[tuple[int, bytes]]]:
    out = {}
    for j, content in corpus.contents.items():
        if j.startswith(prefix):
            msgs = expected_messages(content, begin, end)
            if msgs:
                out[j] = msgs
    return out


def test_dask_reads_every_message_once_on_both_stores(any_store: StoreUnderTest) -> None:
    corpus = build_corpus(any_store)
    assert dask_messages(any_store, selector="prefix=topics/") == expected(corpus)
    # Small spans: uncompressed fragments split, compressed ones too (decompress+skip).
    got = dask_messages(any_store, selector="prefix=topics/clicks/", begin=1234, end=40000,
                        maxSpanBytes=3000, splitCompressed="true", batchBytes=2048)
    assert got == expected(corpus, 1234, 40000, "topics/clicks/")


def test_dask_json_columns_and_bag(file_store: StoreUnderTest) -> None:
    corpus = build_corpus(file_store, sizes={"topics/clicks/part-000": 300})
    content = corpus.contents["topics/clicks/part-000"]
    ddf = read_journals(file_store.url, journal="topics/clicks/part-000",
                        schema={"offset": "int64", "key": "string", "n": "int64",
                                "ts": "timestamp[us, tz=UTC]"})
    pdf = ddf.compute(scheduler="threads").sort_values("offset")
    want = [json.loads(line) for line in content.splitlines()]
    assert pdf.n.tolist() == [m["n"] for m in want]
    assert pdf.key.tolist() == [m["key"] for m in want]
    assert str(pdf.ts.iloc[0]).startswith("2026-01-01")
    bag = read_bag(file_store.url, journal="topics/clicks/part-000").compute(scheduler="sync")
    assert [(o, v) for _, o, v in sorted(bag)] == expected_messages(content)


def test_index_mode_is_the_covering_set(file_store: StoreUnderTest) -> None:
    corpus = build_corpus(file_store, sizes={"topics/views/part-000": 100})
    frags = corpus.fragments["topics/views/part-000"]
    idx = fragment_index(file_store.url, journal="topics/views/part-000")
    assert idx[["begin", "end", "sum", "codec"]].values.tolist() == [
        [f.begin, f.end, f.sum, f.codec.value] for f in frags]


def test_manifest_labels_or_etcd_specs_drive_selectors(file_store: StoreUnderTest, etcd: Any,
                                                       etcd_root: str) -> None:
    from fragment_store import write_manifest
    from protocol import FragmentSpec, JournalSpec, LabelSet

    corpus = build_corpus(file_store, sizes={"topics/clicks/part-000": 50,
                                             "topics/views/part-000": 50})
    store = file_store.store()
    for j, frags in corpus.fragments.items():
        write_manifest(store, j, frags)
    # From the store alone: meta-labels (name, prefix) of manifests and listed keys.
    assert set(dask_messages(file_store, selector="prefix=topics/views/", index="manifest")) \
        == {"topics/views/part-000"}
    # From etcd: the specs' labels.
    import aetcd
    import msgspec

    async def put_specs() -> None:
        async with aetcd.Client(host=etcd.host, port=etcd.port) as client:
            for j, topic in (("topics/clicks/part-000", "clicks"), ("topics/views/part-000", "views")):
                spec = JournalSpec(name=j, labels=LabelSet.of(topic=topic),
                                   fragment=FragmentSpec(stores=(file_store.url,)))
                await client.put(f"{etcd_root}/journals/{j}".encode(), msgspec.json.encode(spec))

    asyncio.run(put_specs())
    got = dask_messages(file_store, selector="topic=clicks", etcd=f"{etcd.host}:{etcd.port}",
                        etcdRoot=etcd_root)
    assert got == expected(corpus, prefix="topics/clicks/")


@pytest.mark.parametrize("options, option", [
    ({"journal": "topics/x", "begin": "soon"}, "begin"),
    ({"journal": "topics/x", "begin": "10", "end": "5"}, "end"),
    ({"journal": "topics/x", "framing": "xml"}, "framing"),
    ({"journal": "../etc/x"}, "journal"),
    ({"selector": "a in ()"}, "selector"),
    ({"journal": "topics/x", "mode": "tail"}, "mode"),
    ({"journal": "topics/x", "colour": "red"}, "colour"),
    ({}, "journal"),
])
def test_bad_options_name_the_option(file_store: StoreUnderTest, options: dict, option: str) -> None:
    with pytest.raises(OptionError) as info:
        read_journals(file_store.url, **options)
    assert info.value.option.lower() == option.lower()
    assert f"option {info.value.option!r}" in str(info.value)


def test_bad_store_option(tmp_path: Any) -> None:
    with pytest.raises(OptionError, match="option 'store'"):
        read_journals("ftp://example/", journal="topics/x")
