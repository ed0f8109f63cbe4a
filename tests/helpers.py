"""Engine-agnostic test helpers shared by every test package."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.005, what: str = ""
) -> T:
    """Polls ``predicate`` until it returns something truthy (returned) or ``timeout`` seconds pass.

    Raises AssertionError on timeout, naming ``what`` (or the predicate) so the failure says what never
    happened. Never use a bare sleep to wait for a condition: poll it with a deadline.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate!r}")
        time.sleep(interval)


def close_pipes(process: subprocess.Popen[Any]) -> None:
    """Closes a finished subprocess's pipes: left to the garbage collector, each is a ResourceWarning,
    which this suite turns into an error (``filterwarnings = error``)."""
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            stream.close()
