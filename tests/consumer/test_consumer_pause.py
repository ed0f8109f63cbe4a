"""Two consumer processes with a lease (``lease_ttl_ms``); the active one is paused (SIGSTOP) until the
standby takes over, then resumed (SIGCONT), several times, while the source is written throughout.

Each consumer copies the changes of A into O (``put`` per data event, two worker threads) and logs what
it delivers. The checkpoint's lineage must be one unbroken chain of windows from the start to A's head
(every change of A in exactly one checkpointed window), with lease versions that never go back (a resumed
consumer checkpointed nothing after its successor); a resumed consumer must deliver nothing -- no data
event, no window end -- until it is active again; and O must end equal to A.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

from diffstore.client import Client
from tests.faults import paused
from tests.helpers import running_server, wait_until

TTL_MS = 3000  # generous: a loaded machine must not delay renewals past it
DEADLINE_S = 120.0
PAUSES = 3
KEYS = [b"k%02d" % i for i in range(40)]

WORKER = textwrap.dedent(
    """
    import os, sys, time
    from diffstore.client import Client
    from diffstore.consumer import Consumer, WindowListener

    url, log_path, hold_path, ttl_ms = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    pid = str(os.getpid())
    log = open(log_path, "a")

    def say(*parts):
        log.write(" ".join(parts) + "\\n")
        log.flush()  # one write() per line, appended: the two processes' lines interleave whole

    class Copier(WindowListener):
        def __init__(self, client):
            self.out = client.collection("O")

        def on_start_window(self, from_positions):
            say("start", pid, from_positions["A"].hex() or "-")

        def on_data_event(self, source, key, old, new):
            say("data", pid, key.decode())
            if os.path.exists(hold_path):  # the test pauses us here, events of this window queued behind
                say("holding", pid)
                while os.path.exists(hold_path):
                    time.sleep(0.01)
            self.out.put(key, new)

        def on_end_window(self, to_positions):
            say("end", pid, to_positions["A"].hex())

        def on_rollback(self, from_positions, error):
            say("rollback", pid, type(error).__name__)

    with Client(url) as client:
        consumer = Consumer(client, ["A"], "cp", Copier(client), lease_ttl_ms=ttl_ms, workers=2,
                            wait_timeout_ms=500, replay_delay_s=0)
        say("ready", pid)
        consumer.run()
    """
)


class SourceWriter(threading.Thread):
    """Commits generations of A, each changing a few keys, until stopped."""

    def __init__(self, client: Client) -> None:
        super().__init__(daemon=True)
        self.source = client.collection("A")
        self.rng = random.Random(25)
        self.stop = threading.Event()
        self.commits = 0
        self.error: BaseException | None = None

    def commit(self, items: list[tuple[bytes, bytes | None]]) -> None:
        current = self.source.generation_id
        generation = (int.from_bytes(current[:8], "big") + 1).to_bytes(8, "big")
        self.source.start_generation(generation)
        self.source.put_many(items, generation_id=generation)
        self.source.commit_generation(generation)
        self.commits += 1

    def run(self) -> None:
        try:
            while not self.stop.wait(0.2):
                keys = self.rng.sample(KEYS, 8)
                self.commit([(k, None if self.rng.random() < 0.2 else b"v%d" % self.commits) for k in keys])
        except BaseException as exc:  # reported by the test
            self.error = exc


def finish_and_read_chain(client: Client, writer: SourceWriter, checkpoint: Any) -> tuple[bytes, list[Any]]:
    """Stops the writer, commits a last generation over every key (it overwrites whatever a fenced-out
    put left behind), waits for the last checkpoint and for O equal to A, and reads the checkpoint's
    chain of windows (each generation with the reader moves its lineage records)."""
    writer.stop.set()
    writer.join(DEADLINE_S)
    assert writer.error is None, writer.error
    writer.commit([(k, b"last") for k in KEYS])
    head = client.collection("A").generation_id
    wait_until(
        lambda: checkpoint.readers()[0].generation_id == head, timeout=DEADLINE_S, what="the last checkpoint"
    )
    source, output = client.collection("A"), client.collection("O")
    expected = {r.key: r.value for r in source.query()}
    wait_until(
        lambda: {r.key: r.value for r in output.query()} == expected, timeout=DEADLINE_S, what="O equal to A"
    )
    generations, more = checkpoint.generations(limit=1000)
    assert not more
    return head, [(g, checkpoint.lineage(g).sources) for g in sorted(generations) if g != bytes(8)]


def assert_one_chain(chain: list[Any], head: bytes, owners: int) -> None:
    """Every change of A in exactly one checkpointed window: the windows chain from the start to A's head,
    with lease versions that never go back and at least ``owners`` of them (a new owner per fault)."""
    position: bytes | None = None
    versions = []
    for generation, sources in chain:
        [moved] = sources
        assert (moved.reader_name, moved.from_generation_id) == ("A", position), generation
        position = moved.to_generation_id
        versions.append(int.from_bytes(generation[8:16], "big"))
    assert position == head
    assert versions == sorted(versions) and len(set(versions)) >= owners


def test_paused_consumers_hand_over_and_deliver_nothing_after_they_resume(tmp_path: Path) -> None:
    script, log, hold = tmp_path / "worker.py", tmp_path / "log", tmp_path / "hold"
    script.write_text(WORKER)
    log.touch()
    hold.touch()  # the first active consumer holds inside its first window: it is paused there

    def lines() -> list[list[str]]:
        return [line.split() for line in log.read_text().splitlines()]

    def ends_of(pid: str, after: int) -> int:
        return sum(1 for w in lines()[after:] if w[:2] == ["end", pid])

    with running_server(tmp_path / "data") as live, live.client() as client:
        client.create_collection("A", manual=True, initial_generation_id=bytes(8))
        client.create_collection("O", manual=False)
        writer = SourceWriter(client)
        writer.commit([(k, b"v0") for k in KEYS])
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        argv = [sys.executable, str(script), live.url, str(log), str(hold), str(TTL_MS)]
        procs = {str(p.pid): p for p in (subprocess.Popen(argv, env=env) for _ in range(2))}
        markers: list[tuple[str, int]] = []  # (pid, the log's length when it was resumed)
        try:
            wait_until(
                lambda: len([w for w in lines() if w[0] == "ready"]) == 2,
                timeout=DEADLINE_S,
                what="both ready",
            )
            wait_until(
                lambda: any(w[0] == "holding" for w in lines()),
                timeout=DEADLINE_S,
                what="the first window held",
            )
            checkpoint = client.collection("cp")  # made by the consumers
            active = next(w[1] for w in lines() if w[0] == "holding")
            writer.start()
            for turn in range(PAUSES):
                other = next(pid for pid in procs if pid != active)
                seen = len(lines())
                if turn > 0:  # the first pause is inside a window (held), the others wherever it is
                    wait_until(
                        lambda: ends_of(active, seen) > 0,  # noqa: B023
                        timeout=DEADLINE_S,
                        what="the active one's next window",
                    )
                version = checkpoint.leases()[0].version
                with paused(procs[active]):
                    if turn == 0:
                        hold.unlink()  # resumed, it would go on with the held window's queued events
                    wait_until(
                        lambda: checkpoint.leases()[0].version > version,  # noqa: B023
                        timeout=DEADLINE_S,
                        what="the standby to take the lease",
                    )
                    markers.append((active, len(lines())))  # while stopped, it writes nothing
                resumed_at = markers[-1][1]
                wait_until(
                    lambda: ends_of(other, resumed_at) > 0,  # noqa: B023
                    timeout=DEADLINE_S,
                    what="the new owner's window",
                )
                active = other
            head, chain = finish_and_read_chain(client, writer, checkpoint)
        finally:
            writer.stop.set()
            for proc in procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(DEADLINE_S)
    assert writer.commits > PAUSES
    # a resumed consumer delivers nothing until it starts a window again, as the active one
    for pid, at in markers:
        mine = [w[0] for w in lines()[at:] if w[1:2] == [pid]]
        until_active = mine[: mine.index("start")] if "start" in mine else mine
        assert set(until_active) <= {"rollback"}, until_active
    assert_one_chain(chain, head, owners=PAUSES)
