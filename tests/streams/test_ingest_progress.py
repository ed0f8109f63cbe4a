"""``diffstore ingest``'s live table: its rate and lag stay live between commits (a fake clock)."""

from __future__ import annotations

import io

from diffstore import logs
from diffstore.streams.ingest import CommitStats
from diffstore.streams.ingest_cli import RATE_WINDOW_S, _Progress


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def stats(applied: int, lag_s: float) -> CommitStats:
    return CommitStats(b"\0" * 8, records=applied, items=applied, applied_total=applied, skipped_total=0,
                       lag_s=lag_s, positions={})  # fmt: skip


def test_rate_and_lag_follow_the_clock_not_only_the_commits() -> None:
    clock = Clock()
    progress = _Progress(logs.console(), log_commits=False, idle_after_s=1.0, clock=clock)
    assert progress.rate() == 0.0 and progress.lag_text(clock.now) == "-"
    for _ in range(4):  # 100 records every 0.5 s: 200/s
        clock.now += 0.5
        progress.on_commit(stats(progress.samples[-1][1] + 100, lag_s=0.25))
    assert progress.rate() == 200.0 and progress.lag_text(clock.now) == "0.25 s"
    clock.now += 0.5  # no commit for half a second: still within a window's time
    assert progress.lag_text(clock.now) == "0.25 s" and 0 < progress.rate() < 200.0
    clock.now += 2.0  # idle: the lag says so, the rate falls (it froze at 200/s before)
    assert progress.lag_text(clock.now) == "caught up (no new record for 2 s)"
    clock.now += RATE_WINDOW_S
    assert progress.rate() == 0.0
    table = io.StringIO()
    logs.console().__class__(file=table, width=100).print(progress.render())
    assert "caught up (no new record for 8 s)" in table.getvalue()


def test_the_console_does_not_colour_pieces_of_an_id() -> None:
    """rich's automatic highlighting coloured the digits inside a base64 id apart from its letters."""
    out = io.StringIO()
    console = logs.console()
    console.file, console._force_terminal = out, True
    console.print("committed base64:AAAAAAAAAAIAAAAAAAAAAQ==, 12 records")
    assert out.getvalue() == "committed base64:AAAAAAAAAAIAAAAAAAAAAQ==, 12 records\n"
