"""Crash test: a writer process is SIGKILLed at random moments; every committed generation survives
complete, nothing uncommitted is visible, and the writer resumes after each restart."""

from __future__ import annotations

import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from diffstore import Reader, Store, StoreConfig
from diffstore.errors import GenerationCollected

from .crash_writer import TRAIL, expected_states, gen_id, generation_items

WRITER = Path(__file__).with_name("crash_writer.py")
ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 6
LINE_DEADLINE_S = 60.0


class Child:
    """The writer process with its stdout lines in a queue (read by a thread, so waits have deadlines)."""

    def __init__(self, path: Path, sync: bool, one_call: bool = False) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        modes = [*([] if sync else ["nosync"]), *(["one-call"] if one_call else [])]
        self.proc = subprocess.Popen(
            [sys.executable, str(WRITER), str(path), *modes],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def next_line(self) -> str:
        try:
            line = self.lines.get(timeout=LINE_DEADLINE_S)
        except queue.Empty:
            raise AssertionError("the writer printed nothing before the deadline") from None
        if line is None:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"the writer exited early: {self.proc.wait()} {err}")
        return line

    def kill(self) -> list[str]:
        """SIGKILLs the writer; returns the lines it printed that were not read yet."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        rest: list[str] = []
        while True:  # the pump thread ends the queue with None once stdout is closed
            try:
                line = self.lines.get(timeout=LINE_DEADLINE_S)
            except queue.Empty:
                raise AssertionError("the writer's output never ended") from None
            if line is None:
                break
            rest.append(line)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        return rest


def _check(path: Path, printed: int, one_call: bool = False) -> int:
    """Checks the store after a crash; returns its current generation number."""
    with Store.open(path, config=StoreConfig(background=False)) as store:
        c = store.collection("c")
        current = int.from_bytes(c.generation_id, "big")
        # every commit the writer reported is there; at most one more finished before the kill
        assert printed <= current <= printed + 1, (printed, current)
        # the reader updates were part of the same transaction as the commit
        trail = max(0, current - TRAIL)
        assert c.readers() == [
            Reader("progress", "hstream://crash", gen_id(current)),
            Reader("trail", "c", gen_id(trail)),
        ]
        states = expected_states(current + 1)
        for m in range(current + 1):
            try:
                got = {r.key: r.value for r in c.query(generation_id=gen_id(m))}
            except GenerationCollected:
                assert m < trail, f"generation {m} at or above the readers' minimum was collected"
                continue
            assert got == states[m], f"generation {m} is not complete"
        # GC (killed in the middle of its steps too) never touches what is visible from the readers' minimum
        for m in range(trail, current + 1):
            assert {r.key: r.value for r in c.query(generation_id=gen_id(m))} == states[m]
        if current >= 1:
            changed = {i.key for i in c.diff(gen_id(current - 1), gen_id(current))}
            first, second = generation_items(current)
            assert changed <= {k for k, _ in first + second}
        nxt = c.next_generation_id
        if one_call and (current + 1) % 2:
            assert nxt is None, "write_generation left its generation open"
        if nxt is not None:
            # a half-written next generation is visible only to a read at its id, one whole put_many at a time
            assert nxt == gen_id(current + 1)
            own = {r.key: r.value for r in c.query(generation_id=nxt)}
            first, second = generation_items(current + 1)
            allowed = [dict(states[current])]
            for batch in (first, first + second):
                state = dict(states[current])
                for key, value in batch:
                    if value is None:
                        state.pop(key, None)
                    else:
                        state[key] = value
                allowed.append(state)
            assert own in allowed
        return current


@pytest.mark.parametrize(
    ("sync", "one_call"), [(True, False), (False, False), (True, True)], ids=["sync", "nosync", "one-call"]
)
def test_sigkill_at_random_moments(tmp_path: Path, sync: bool, one_call: bool) -> None:
    """With ``sync=False`` too: a killed process leaves its commits in the OS page cache. With
    ``one_call``, odd generations are written by ``write_generation``: whole or not at all."""
    path = tmp_path / "store"
    rng = random.Random(os.environ.get("CRASH_SEED", "1"))
    printed = 0
    total_resumed = []
    for _ in range(ROUNDS):
        child = Child(path, sync, one_call)
        rest: list[str] = []
        try:
            ready = child.next_line()
            assert ready.startswith("ready ")
            resumed = int(ready.split()[1])
            assert resumed >= printed  # the writer resumes from what was committed
            total_resumed.append(resumed)
            want = rng.randint(1, 4)
            for _ in range(want):
                line = child.next_line()
                assert line.startswith("committed ")
                printed = int(line.split()[1])
            # a random moment inside the next generation's start/put_many/put_many/commit: this
            # jitter picks where the kill lands, nothing waits on it
            time.sleep(rng.uniform(0, 0.03))
        finally:
            rest = child.kill()
        for line in rest:
            assert line.startswith("committed ")
            printed = int(line.split()[1])
        printed = _check(path, printed, one_call)
    assert total_resumed == sorted(total_resumed)
    assert printed >= ROUNDS
