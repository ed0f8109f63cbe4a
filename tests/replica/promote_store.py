"""What the promotion and fencing tests need: a primary with a life behind it, a writer that runs while a
promotion happens, and the questions the tests ask of servers (their role, whether a write is taken).

The primary's store (:func:`live`): a manual collection whose first generations were garbage-collected
(its reader moved on), a pipeline (an automatic source and a manual target whose commits move a reader
of the source), a collection deleted and created again, an empty one, one with a lease. Built through
the HTTP API as a user's jobs would, then GC is waited for. The tests start their replicas first, so that
they follow this life as it happens (a replica started on it afterwards is the follower's concern).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import httpx

from diffstore.client import Client
from diffstore.engine.types import ReaderUpdate
from diffstore.errors import DiffstoreError, GenerationCollected
from tests.helpers import wait_until

LIVE = ("D", "E", "L", "M", "S", "T")


def live(p: Client, settle: Callable[[], object] = lambda: None) -> None:
    """Gives the primary's store its history (see the module); returns once GC collected M's start.

    ``settle()`` waits for the replicas to copy: called once M exists, so that their holds keep what they
    copy next from the primary's GC.
    """
    m = p.create_collection("M", manual=True)
    m.create_reader("r", generation_id=None)
    settle()
    m.write_generation(b"g1", [(b"a", b"1"), (b"b", b"1"), (b"c", b"1")], [("r", b"g1")])
    m.write_generation(b"g2", [(b"a", b"2"), (b"c", None)], [("r", b"g2")])  # "" and g1 collectable
    s = p.create_collection("S", manual=False)
    t = p.create_collection("T", manual=True)
    t.create_reader("from_s", "S", None)
    for round_ in range(1, 4):
        written = s.put_many([(b"s%d" % i, b"%d" % (i * round_)) for i in range(20)]).generation_id
        wait_until(lambda w=written: s.generation_id == w, 60, what="S's automatic commit")
        current = written
        g = b"t%d" % round_
        t.write_generation(g, [(b"seen", current)], [ReaderUpdate("from_s", current)])
    d = p.create_collection("D", manual=True)
    d.write_generation(b"old", [(b"gone", b"x")])
    p.delete_collection("D")
    d = p.create_collection("D", manual=True)
    d.write_generation(b"new", [(b"fresh", b"y")])
    p.create_collection("E", manual=True)
    lease = p.create_collection("L", manual=False)
    lease.acquire_lease("owner", "job-1", 600_000)
    written = lease.put(b"l", b"1").generation_id
    wait_until(lambda: lease.generation_id == written, 60, what="L's automatic commit")
    wait_until(lambda: _collected(m, b"g1"), 120, what="GC to collect M's first generations")


def _collected(m: Any, generation: bytes) -> bool:
    try:
        m.get(b"a", generation_id=generation)
    except GenerationCollected:
        return True
    return False


def replication(url: str) -> dict[str, Any]:
    """``GET /replication`` of a server."""
    with httpx.Client(timeout=60) as http:
        answer = http.get(f"{url}/replication")
        assert answer.status_code == 200, answer.text
        return answer.json()  # type: ignore[no-any-return]


def write_answer(url: str, name: str = "M") -> tuple[int, str]:
    """Tries a write that cannot succeed on a primary either (a generation below the current one) and
    changes nothing: (status, error code). A writable primary answers 409 ``outdatedGeneration``."""
    with httpx.Client(timeout=60) as http:
        answer = http.post(f"{url}/collections/{name}/generation/start", json={"generationId": {"value": ""}})
        return answer.status_code, answer.json().get("error", "")


def writable(url: str) -> bool:
    return write_answer(url) == (409, "outdatedGeneration")


class Writer(threading.Thread):
    """Writes to the primary without pause (an automatic collection ``W``, one put a request) until
    stopped or refused; ``acked`` holds each write the primary acknowledged: (key, generation)."""

    def __init__(self, url: str) -> None:
        super().__init__(name="writer", daemon=True)
        self.url = url
        self.acked: list[tuple[bytes, bytes]] = []
        self.refused: DiffstoreError | None = None
        self.stopping = threading.Event()

    def run(self) -> None:
        with Client(self.url, timeout_s=60) as client:
            w = client.collection("W")
            n = 0
            while not self.stopping.is_set():
                n += 1
                key = b"w%06d" % n
                try:
                    result = w.put(key, key)
                except DiffstoreError as exc:
                    self.refused = exc
                    return
                self.acked.append((key, result.generation_id))

    def stop(self) -> None:
        self.stopping.set()
        self.join(60)
