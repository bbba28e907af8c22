"""workers/jobs_wait.py: why a window waits on a journal and when to roll it (pure)."""

from __future__ import annotations

from workers.jobs_wait import JournalWait, RollRecord, assess, size

NEEDED = 1_000.0
KW = {"roll_after": 5.0, "retry_after": 30.0, "pulse_interval": 1.0}


def w(**kw: object) -> JournalWait:
    base: dict[str, object] = {"journal": "h/in/b", "needed": NEEDED, "mark": (NEEDED + 1, 1741),
                               "through": 0, "since": 545.0}
    base.update(kw)
    return JournalWait(**base)  # type: ignore[arg-type]


def test_no_pulse_since_the_window_end() -> None:
    reason, roll = assess(w(mark=None), now=NEEDED + 2, **KW)
    assert not roll and "waiting for its first pulse after" in reason
    reason, roll = assess(w(mark=None), now=NEEDED + 60, **KW)
    assert not roll and "pulses are not reaching it" in reason and "`pulse`" in reason


def test_persisted_already_waits_for_the_index_refresh() -> None:
    reason, roll = assess(w(through=1741), now=NEEDED + 10, **KW)
    assert not roll and "waiting for its index refresh" in reason
    reason, roll = assess(w(through=None), now=NEEDED + 10, **KW)
    assert not roll and "queue `index`" in reason


def test_an_open_fragment_is_given_roll_after_then_rolled() -> None:
    reason, roll = assess(w(), now=NEEDED + 3, **KW)
    assert not roll
    assert reason.startswith("h/in/b: bytes [0 B, 1.7 KB) acknowledged since 00:09:05 are "
                             "not persisted yet"), reason
    reason, roll = assess(w(), now=NEEDED + 6, **KW)
    assert roll and "asking its primary to close the open fragment" in reason


def test_a_roll_request_is_reported_and_repeated_after_retry_after() -> None:
    asked = RollRecord(below=1741, at=NEEDED + 6)
    reason, roll = assess(w(roll=asked), now=NEEDED + 8, **KW)
    assert not roll and "no answer yet" in reason
    failed = RollRecord(below=1741, at=NEEDED + 6, error="UNAVAILABLE: no primary")
    reason, roll = assess(w(roll=failed), now=NEEDED + 8, **KW)
    assert not roll and "failed at" in reason and "no primary" in reason
    _, roll = assess(w(roll=failed), now=NEEDED + 40, **KW)
    assert roll
    done = RollRecord(below=1741, at=NEEDED + 6, done=NEEDED + 7)
    reason, roll = assess(w(roll=done), now=NEEDED + 9, **KW)
    assert not roll and "not in the store" in reason and "quire doctor" in reason
    # A request for an earlier mark does not count for this one.
    _, roll = assess(w(roll=RollRecord(below=100, at=NEEDED)), now=NEEDED + 6, **KW)
    assert roll


def test_size() -> None:
    assert [size(n) for n in (0, 1023, 1741, 5 << 20)] == ["0 B", "1023 B", "1.7 KB", "5.0 MB"]
