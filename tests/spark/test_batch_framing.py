"""Executor-side reads of planned spans from a file store (no JVM): every message of a
read is yielded whole exactly once, whatever the fragment cuts, codecs and span sizes."""

from __future__ import annotations

import random
import tempfile

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fragment_store import open_store
from fragment_store.keys import fragment_key
from spark.framing import ReadPastExhausted, StoreRef, read_span, strip_delimiters
from spark.planner import plan
from tests.spark.batch_corpus import CODECS, expected_messages, json_lines, persist_journal

J = "test/framing"


def read_all(url: str, frags: list, framing: str = "lines", batch_bytes: int = 1 << 20,
             **kw: object) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    for span in plan(frags, **kw):  # type: ignore[arg-type]
        for b in read_span(span, StoreRef(url), framing=framing, batch_bytes=batch_bytes):
            vals = b.values if framing == "raw" else strip_delimiters(b.values)
            out.extend(zip(b.offsets.tolist(), vals.to_pylist()))
    return out


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), n_cuts=st.integers(0, 25),
       begin_frac=st.floats(0, 1), end_frac=st.floats(0, 1),
       max_span=st.sampled_from([50, 333, 1 << 20]), min_span=st.sampled_from([0, 700]),
       batch=st.sampled_from([1024, 4096, 1 << 20]), trailing_newline=st.booleans())
def test_every_message_once_whole(seed: int, n_cuts: int, begin_frac: float, end_frac: float,
                                  max_span: int, min_span: int, batch: int,
                                  trailing_newline: bool) -> None:
    rng = random.Random(seed)
    content = json_lines(rng, rng.randrange(1, 80), long_every=7)
    if not trailing_newline:
        content = content[:-1]
    cuts = sorted(rng.sample(range(1, len(content)), min(n_cuts, len(content) - 1)))
    with tempfile.TemporaryDirectory() as d:
        url = f"file://{d}/"
        r = rng.randrange(4)
        frags = persist_journal(open_store(url), J, content, cuts, CODECS[r:] + CODECS[:r])
        # A requested begin is trusted as a message start: pick a real one or any byte.
        begin = int(begin_frac * len(content))
        end = begin + int(end_frac * (len(content) - begin)) if end_frac < 0.9 else None
        got = read_all(url, frags, batch_bytes=batch, begin=begin, end=end,
                       max_span_bytes=max_span, min_span_bytes=min_span, split_compressed=True)
    assert got == expected_messages(content, begin, end)


def test_raw_framing_is_the_exact_bytes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(3)
    content = json_lines(rng, 300)
    url = f"file://{tmp_path}/"
    frags = persist_journal(open_store(url), J, content, sorted(rng.sample(range(1, len(content)), 9)))
    got = read_all(url, frags, framing="raw", begin=17, end=len(content) - 5, max_span_bytes=1000)
    assert b"".join(v for _, v in got) == content[17:-5]
    assert [o for o, _ in got] == sorted(o for o, _ in got)


def test_journal_offsets_need_not_start_at_zero(tmp_path) -> None:  # type: ignore[no-untyped-def]
    content = b"a\nbb\nccc\n"
    url = f"file://{tmp_path}/"
    frags = persist_journal(open_store(url), J, content, [3, 6], start=1000)
    assert read_all(url, frags) == [(1000, b"a"), (1002, b"bb"), (1005, b"ccc")]
    # From the middle of "bb": the requested begin is trusted as a start.
    assert read_all(url, frags, begin=1003) == [(1003, b"b"), (1005, b"ccc")]


def test_a_message_longer_than_the_read_past_budget_fails_clearly(tmp_path) -> None:  # type: ignore[no-untyped-def]
    content = b"x" * 50 + b"\nshort\n"
    url = f"file://{tmp_path}/"
    frags = persist_journal(open_store(url), J, content, list(range(5, 50, 5)))
    with pytest.raises(ReadPastExhausted, match="readPastFragments"):
        read_all(url, frags, read_past_fragments=2)
    assert read_all(url, frags, read_past_fragments=20) == [(0, b"x" * 50), (51, b"short")]


def test_empty_lines_are_messages_for_lines_framing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    content = b"\n\na\n\n"
    url = f"file://{tmp_path}/"
    frags = persist_journal(open_store(url), J, content, [1, 2, 3])
    assert read_all(url, frags) == [(0, b""), (1, b""), (2, b"a"), (4, b"")]


def test_record_batches_equal_the_framed_messages(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The executors' path (`read_record_batches`: reused delimiter masks, constant
    columns sliced from a cache) yields exactly what framing + stripping yields, batch
    after batch and span after span in one thread."""
    from spark.arrow import base_arrow_schema, read_record_batches

    rng = random.Random(5)
    content = json_lines(rng, 400, long_every=9) + b"\n\nlast"
    url = f"file://{tmp_path}/"
    frags = persist_journal(open_store(url), J, content, sorted(rng.sample(range(1, len(content)), 12)))
    for framing in ("lines", "jsonl"):
        schema = base_arrow_schema(framing)
        for batch_bytes in (1024, 5000, 1 << 20):
            rows = []
            for span in plan(frags, max_span_bytes=3000, split_compressed=True):
                for rb in read_record_batches(span, StoreRef(url), schema, framing, batch_bytes):
                    assert rb.schema == schema
                    rows.extend(zip(*(rb.column(c).to_pylist() for c in schema.names)))
            want = [(o, v) for o, v in expected_messages(content)
                    if framing == "lines" or v]
            assert [(r[1], r[2].encode()) for r in rows] == want
            assert {r[0] for r in rows} == {J}
            keys = {f.begin: fragment_key(f) for f in frags}
            starts = sorted(keys)
            assert [r[3] for r in rows] == [keys[max(b for b in starts if b <= r[1])] for r in rows]


def test_repeated_columns_are_exact_at_any_length() -> None:
    from spark.framing import REPEAT_CACHE_BYTES, repeated

    for n in (0, 1, 2, 3, 1000, 1025, REPEAT_CACHE_BYTES // 4 + 3):
        col = repeated("topics/a", n)
        assert len(col) == n and col.type == pa.string()
        assert col.to_pylist() == ["topics/a"] * n
    assert repeated("x", 5, large=True).type == pa.large_string()
