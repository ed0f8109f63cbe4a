"""Named points where a test may have the process killed (``kill -9`` of itself) or stopped (``SIGSTOP`` of
itself, until the test sends ``SIGCONT``), to prove that a backup or a compaction cut off or paused there
leaves what it promises. Nothing happens unless the environment variable ``DIFFSTORE_CRASH_AT`` (kill) or
``DIFFSTORE_STOP_AT`` (stop) names the point; the tests in tests/engine/test_backup_crash.py and
test_backup_faults.py set them."""

from __future__ import annotations

import os
import signal

CRASH_AT_ENV = "DIFFSTORE_CRASH_AT"
STOP_AT_ENV = "DIFFSTORE_STOP_AT"


def reached(point: str) -> None:
    """Kills this process at once (SIGKILL: no cleanup, no flush) when ``DIFFSTORE_CRASH_AT`` is ``point``;
    stops it (SIGSTOP: every thread, as a paused process) when ``DIFFSTORE_STOP_AT`` is."""
    if os.environ.get(CRASH_AT_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get(STOP_AT_ENV) == point:
        os.kill(os.getpid(), signal.SIGSTOP)
