"""Two ``diffstore transform --watch`` runners with a lease; the active one is paused (SIGSTOP of its whole
process group: the driver, its lease keeper and its Spark JVM) until the standby takes over, then resumed
(SIGCONT), several times, while the sources are written throughout.

The job and the exactly-once check are those of ``transform_runners.py``: C equals the recomputation from
A and B, its lineage is one unbroken chain with lease versions that never go back, and a resumed runner
reports ``lease lost`` and commits nothing until it is active again.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from transform_runners import (
    ROUND_S,
    SourceWriter,
    assert_exactly_once,
    assert_fenced_while_faulted,
    events,
    finish_writing,
    last_state,
    names_of,
    running,
)

from diffstore import Store
from tests.faults import paused
from tests.helpers import wait_until

pytest.importorskip("pyspark")

PAUSES = 3


def pause_until_taken_over(
    proc: subprocess.Popen[bytes], mine: Path, other: Path, hold: Path | None = None
) -> int:
    """Stops the active runner's process group until the other runner is active, then resumes it and
    waits until it stands by; returns how many log lines it wrote before it resumed.

    With ``hold`` the runner is inside a round, held by the job: the hold is lifted while it is stopped,
    so it resumes straight into its writes. Without, it is paused once it committed one more round.
    """
    if hold is None:
        done = names_of(mine).count("round committed")
        wait_until(
            lambda: names_of(mine).count("round committed") > done, ROUND_S, 0.05, "the active runner's round"
        )
    taken = names_of(other).count("active")
    with paused(proc, group=True):
        if hold is not None:
            hold.unlink()
        wait_until(lambda: names_of(other).count("active") > taken, ROUND_S, 0.05, "the standby to take over")
        before = len(events(mine))
    wait_until(lambda: last_state(mine) != "active", ROUND_S, 0.05, "the resumed runner to stand by")
    return before


def test_paused_runners_hand_over_and_commit_nothing_after_they_resume(
    tmp_path: Path, server_url: str, store: Store, names: dict[str, str]
) -> None:
    for name in (names["A"], names["B"], names["C"]):
        store.create_collection(name, manual=True)
    writer = SourceWriter(store, names["A"], names["B"])
    resumed: list[tuple[int, int]] = []  # (runner, how many of its log lines were written before it resumed)
    try:
        with running(tmp_path, [server_url, server_url], names) as runners:
            held = runners.held_runner()
            writer.start()
            procs, stderr = runners.procs, runners.stderr
            resumed.append(
                (held, pause_until_taken_over(procs[held], stderr[held], stderr[1 - held], runners.hold))
            )
            for _ in range(PAUSES - 1):
                active = runners.active()
                resumed.append(
                    (active, pause_until_taken_over(procs[active], stderr[active], stderr[1 - active]))
                )
            heads = finish_writing(store, writer, names)
    finally:
        writer.stop.set()
    assert writer.commits >= PAUSES
    assert_exactly_once(store, writer, names, heads, PAUSES)
    # a resumed runner committed nothing before it was active again; the held one went on with its round,
    # and its writes (or its commit) were refused
    for i, (runner, before) in enumerate(resumed):
        assert_fenced_while_faulted(runners.stderr[runner], before)
        if i == 0:
            since = events(runners.stderr[runner])[before:]
            failed = [e for e in since if e.get("event") == "round failed, retrying"]
            assert failed and "leaselost" in str(failed[0].get("error")).lower(), failed
