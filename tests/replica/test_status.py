"""The follower's state and back-off (``diffstore.replica._status``), without I/O: one line per change of
state, none for a repeated failure; a back-off that doubles, is bounded, has jitter, and resets."""

from __future__ import annotations

import random

from diffstore.replica._status import COPYING, FOLLOWING, STALLED, Backoff, Tracker


def test_one_line_per_change_of_state_and_none_for_a_repeated_failure() -> None:
    tracker = Tracker(Backoff(0.2, 10.0), random.Random(1))
    first = tracker.ok("M", COPYING, 1_000)
    assert first.changed and first.state == COPYING and first.since_ms == 1_000
    following = tracker.ok("M", FOLLOWING, 2_000, " from generation g2")
    assert following.line == "replica: M: following from generation g2"
    assert not tracker.ok("M", FOLLOWING, 3_000).changed  # no change, no line, same since
    assert tracker.get("M").since_ms == 2_000

    stalled = tracker.failed("M", "timed out (storageError)", 4_000, 100.0)
    assert stalled.changed and stalled.state == STALLED and stalled.reason == "timed out (storageError)"
    assert stalled.line is not None and stalled.line.startswith("replica: M: stalled: timed out")
    again = tracker.failed("M", "timed out (storageError)", 5_000, 101.0)
    assert not again.changed and again.line is None and again.since_ms == 4_000
    other = tracker.failed("M", "collected (generationCollected)", 6_000, 102.0)
    assert other.changed and other.line is not None and "still stalled" in other.line

    back = tracker.ok("M", FOLLOWING, 7_000)
    assert back.changed and back.line is not None
    assert "following again (stalled after 3 failed attempts: collected (generationCollected))" in back.line
    assert tracker.get("M").failures == 0 and tracker.due("M", 0.0)


def test_the_back_off_doubles_is_bounded_has_jitter_and_resets() -> None:
    backoff = Backoff(0.2, 10.0)
    rng = random.Random(7)
    assert backoff.delay_s(0, rng) == 0.0
    for failures in range(1, 40):
        full = min(10.0, 0.2 * 2 ** (failures - 1))
        delays = {backoff.delay_s(failures, rng) for _ in range(20)}
        assert all(full / 2 <= d <= full for d in delays)
        assert len(delays) > 1  # jitter: not in step
    tracker = Tracker(backoff, random.Random(3))
    for n in range(10):
        tracker.failed("M", "down", n, 50.0)
    status = tracker.get("M")
    assert 50.0 + 5.0 <= status.retry_at <= 50.0 + 10.0  # capped
    assert not tracker.due("M", 54.0) and tracker.due("M", 60.1)
    assert tracker.next_retry(50.0) == status.retry_at - 50.0
    tracker.ok("M", FOLLOWING, 100)
    assert tracker.next_retry(50.0) is None


def test_an_unreachable_primary_stalls_without_a_line_or_a_back_off_of_its_own() -> None:
    tracker = Tracker()
    tracker.ok("M", FOLLOWING, 1)
    change = tracker.unreachable("M", "cannot reach the primary: refused (storageError)", 2)
    assert change.changed and change.line is None and change.state == STALLED
    assert not tracker.unreachable("M", "cannot reach the primary: refused (storageError)", 3).changed
    assert tracker.due("M", 0.0)
