"""The consumer checker on constructed histories: a recovery log (fences and batches as
the Counts example writes them), its source journal, and etcd snapshots of the locks.

A correct log must check clean, and each kind of wrong one must be reported: a count
off by one either way, a batch written by a fenced (zombie) author, an offset past the
head or inside a message, two primaries in one snapshot."""

from __future__ import annotations

from chaos.checker import SAFETY_KEYS, Report
from chaos.consumer_check import (
    CONSUMER_SAFETY_KEYS,
    PrimaryWatch,
    ShardReadback,
    check_consumers,
    model_counts,
)
from chaos.schedule import (
    CONSUMER_KINDS,
    DEFAULT_KINDS,
    FaultKind,
    ScheduleConfig,
    build_schedule,
)
from consumers.recoverylog import Record, RecordReader, encode_record
from consumers.store import OFFSET_PREFIX

SOURCE = "chaos/events/p-000"


def line(key: str, seq: int) -> bytes:
    return b'{"key":"%s","w":0,"s":%d}\n' % (key.encode(), seq)


def source(keys: str) -> bytes:
    """One line per character: 'aab' -> keys a, a, b."""
    return b"".join(line(k, i) for i, k in enumerate(keys))


def batch(author: str, counts: dict[str, int], offset: int) -> Record:
    ops = [(b"c/" + k.encode(), b"%d" % n) for k, n in sorted(counts.items())]
    ops.append((OFFSET_PREFIX + SOURCE.encode(), str(offset).encode()))
    return Record(author=author, ops=ops)


def shard_of(records: list[Record], data: bytes) -> ShardReadback:
    """Records -> log bytes -> RecordReader -> LogState, as the runner reads a log."""
    log_bytes = b"".join(encode_record(r) for r in records)
    sh = ShardReadback("chaos-count-0", SOURCE, data, log_head=len(log_bytes))
    reader = RecordReader(0)
    for at in range(0, len(log_bytes), 7):  # fed in odd-sized chunks
        for record, end in reader.feed(at, log_bytes[at:at + 7]):
            sh.log.apply(record, end)
    return sh


def safety(report_counts: dict[str, int]) -> dict[str, int]:
    return {k: report_counts[k] for k in CONSUMER_SAFETY_KEYS if report_counts[k]}


def test_model_counts_lines_below_the_offset_only() -> None:
    data = source("aab") + b"\n\n" + source("c")  # a hole read back as newlines
    counts, n = model_counts(data, 0, len(data))
    assert counts == {"a": 2, "b": 1, "c": 1} and n == 4
    first_two = len(line("a", 0)) + len(line("a", 1))
    assert model_counts(data, 0, first_two) == ({"a": 2}, 2)


def test_a_correct_log_over_two_terms_checks_clean() -> None:
    data = source("aabac")
    cut = len(source("aab"))
    records = [Record(author="z1.m0.5", fence=True), batch("z1.m0.5", {"a": 2, "b": 1}, cut),
               # kill -9, successor fences and counts the rest
               Record(author="z2.m1.9", fence=True), batch("z2.m1.9", {"a": 3, "c": 1}, len(data))]
    report = check_consumers([shard_of(records, data)], PrimaryWatch())
    assert safety(report.counts) == {}
    assert report.counts["consumer_keys"] == 3
    assert report.counts["consumer_messages"] == 5 == report.counts["consumer_counted"]
    assert report.counts["consumer_behind"] == 0
    assert report.shards["chaos-count-0"]["terms"] == 2


def test_wrong_counts_are_mismatches_over_and_under() -> None:
    data = source("aab")
    # The deliberately wrong state: "a" counted three times (a message counted twice
    # after a failover), "b" never.
    records = [Record(author="x", fence=True), batch("x", {"a": 3}, len(data))]
    report = check_consumers([shard_of(records, data)], PrimaryWatch())
    assert report.counts["consumer_mismatches"] == 2
    assert report.counts["consumer_overcounted"] == 1
    assert report.counts["consumer_undercounted"] == 1
    assert any("'a': committed 3, model 2" in e for e in report.examples["consumer_mismatches"])
    assert "by 'x'" in report.shards["chaos-count-0"]["first_divergence"]


def test_a_shard_behind_is_checked_up_to_its_committed_offset() -> None:
    data = source("aabb")
    cut = len(source("aa"))
    records = [Record(author="x", fence=True), batch("x", {"a": 2}, cut)]
    report = check_consumers([shard_of(records, data)], PrimaryWatch())
    assert safety(report.counts) == {}
    assert report.counts["consumer_behind"] == 1
    # ...but state ahead of its own committed offset is not.
    records = [Record(author="x", fence=True), batch("x", {"a": 2, "b": 1}, cut)]
    assert check_consumers([shard_of(records, data)], PrimaryWatch()).counts["consumer_overcounted"] == 1


def test_a_batch_after_another_authors_fence_is_a_zombie_commit() -> None:
    data = source("ab")
    records = [Record(author="old", fence=True), batch("old", {"a": 1}, len(line("a", 0))),
               Record(author="new", fence=True),
               batch("old", {"a": 1, "b": 1}, len(data))]  # the zombie's write landed
    report = check_consumers([shard_of(records, data)], PrimaryWatch())
    assert report.counts["consumer_zombie_commits"] == 1
    assert "'old'" in report.examples["consumer_zombie_commits"][0]


def test_offsets_past_the_head_or_inside_a_message_are_bad() -> None:
    data = source("ab")
    past = [Record(author="x", fence=True), batch("x", {"a": 1, "b": 1}, len(data) + 5)]
    assert check_consumers([shard_of(past, data)], PrimaryWatch()).counts["consumer_bad_offsets"] == 1
    inside = [Record(author="x", fence=True), batch("x", {"a": 1}, len(line("a", 0)) + 3)]
    assert check_consumers([shard_of(inside, data)], PrimaryWatch()).counts["consumer_bad_offsets"] == 1


def test_watch_counts_dual_primary_episodes_and_primary_changes() -> None:
    w = PrimaryWatch()
    w.observe(10, {"s0": "a#m0", "s1": "b#m1"}, [("s0", "a#m0"), ("s1", "b#m1")])
    w.observe(11, {"s0": "b#m1"}, [("s0", "b#m1")])  # s0 moved; s1's lock expired
    w.observe(12, {"s0": "b#m1", "s1": "c#m2"}, [("s0", "b#m1"), ("s0", "a#m0")])  # zombie report
    w.observe(13, {"s0": "b#m1", "s1": "c#m2"}, [("s0", "b#m1"), ("s0", "a#m0")])  # same episode
    w.observe(14, {"s0": "b#m1", "s1": "c#m2"}, [("s1", "c#m2"), ("s1", "a#m0")])
    assert w.polls == 5
    assert w.dual == 2
    assert w.changes == {"s0": 1, "s1": 1}
    report = check_consumers([], w)
    assert report.counts["consumer_dual_primaries"] == 2
    assert report.counts["consumer_primary_changes"] == 2
    assert "rev 12: s0" in report.examples["consumer_dual_primaries"][0]


def test_consumer_counts_make_a_report_unsafe() -> None:
    counts = {k: 0 for k in SAFETY_KEYS}
    report = Report(counts, {}, {}, {}, {}, {})
    assert report.safe
    data = source("a")
    bad = check_consumers([shard_of([Record(author="x", fence=True), batch("x", {"a": 2}, len(data))],
                                    data)], PrimaryWatch())
    report.add_consumers(bad.counts, bad.examples, bad.shards)
    assert not report.safe
    assert report.to_json()["safety"]["consumer_overcounted"] == 1


def test_consumer_faults_are_a_second_track_that_leaves_the_broker_one_alone() -> None:
    kinds = DEFAULT_KINDS + CONSUMER_KINDS
    for seed in range(5):
        both = build_schedule(ScheduleConfig(duration=60, seed=seed, kinds=kinds, shards=4))
        broker = build_schedule(ScheduleConfig(duration=60, seed=seed))
        assert [e for e in both if e.kind not in CONSUMER_KINDS] == broker
        track = [e for e in both if e.kind in CONSUMER_KINDS]
        assert len(track) >= 2, (seed, track)  # a 60 s smoke run sees consumer faults
        for prev, ev in zip(track, track[1:]):
            assert ev.at >= prev.ends
        for ev in track:
            assert 0 <= ev.journal < 4 and ev.ends <= 60 - 12 + 1e-6
            if ev.kind is FaultKind.PAUSE_CONSUMER:
                assert ev.duration > 5.0  # past the member's lease
    assert [e.at for e in both] == sorted(e.at for e in both)


def out_line(shard: str, key: str, n: int) -> bytes:
    return b'{"shard":"%s","key":"%s","count":%d}\n' % (shard.encode(), key.encode(), n)


def test_published_totals_must_end_at_the_committed_state_once_each() -> None:
    data = source("aab")
    records = [Record(author="x", fence=True), batch("x", {"a": 2, "b": 1}, len(data))]
    good = out_line("chaos-count-0", "a", 1) + out_line("chaos-count-0", "a", 2) + \
        out_line("chaos-count-0", "b", 1)
    report = check_consumers([shard_of(records, data)], PrimaryWatch(), good)
    assert safety(report.counts) == {} and report.counts["consumer_outputs_checked"] == 2
    # A stale last total (the last transaction's outputs never sent) and a total sent twice.
    bad = out_line("chaos-count-0", "a", 1) + out_line("chaos-count-0", "b", 1) + \
        out_line("chaos-count-0", "b", 1)
    report = check_consumers([shard_of(records, data)], PrimaryWatch(), bad)
    assert report.counts["consumer_output_mismatches"] == 1
    assert "'a': last published total 1, committed 2" in report.examples["consumer_output_mismatches"][0]
    assert report.counts["consumer_output_duplicates"] == 1
    # A shard still behind its source is not held to its outputs (they may be in flight).
    behind = [Record(author="x", fence=True), batch("x", {"a": 2}, len(source("aa")))]
    report = check_consumers([shard_of(behind, data)], PrimaryWatch(), b"")
    assert report.counts["consumer_output_mismatches"] == 0 and report.counts["consumer_behind"] == 1
