"""A writer in its own process, driven line by line: ``python lease_actor.py (--data DIR | --url URL) C``.

Tests of fencing (tests/engine/test_lease_fencing.py, tests/server/test_lease_fencing_http.py) run two of
them, A and B, on one collection -- over one data directory (two stores) or one server (two clients) -- and
play an owner change step by step. Each stdin line is a JSON command, each answer one JSON line::

    {"op": "acquire", "name", "owner", "ttl"}             -> {"version": v}
    {"op": "renew", "name", "owner", "version"}           -> {"version": v}
    {"op": "start", "g", "lease"?, "abort"?}              -> {}
    {"op": "put", "g", "key", "value", "lease"?}          -> {}
    {"op": "commit" | "abort", "g", "lease"?}             -> {}
    {"op": "state"}                                       -> {"current", "next"}
    {"op": "get", "key", "g"?}                            -> {"value": str | null}

Generation ids, keys and values are UTF-8 text; ``lease`` is ``[name, version]``. A refused command answers
``{"error": code}`` (a :class:`~diffstore.errors.DiffstoreError`'s code).
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from diffstore.collection import Collection
from diffstore.engine.types import LeaseToken
from diffstore.errors import DiffstoreError
from tests.faults import TcpProxy, paused
from tests.helpers import wait_until


def _fencing(cmd: dict[str, Any]) -> dict[str, LeaseToken]:
    """``lease=`` for the call when the command carries one (none: the call as a writer without leases
    makes it)."""
    lease = cmd.get("lease")
    return {} if lease is None else {"lease": LeaseToken(lease[0], lease[1])}


def run(c: Collection, cmd: dict[str, Any]) -> dict[str, Any]:
    op = cmd["op"]
    g = cmd.get("g", "").encode()
    if op == "acquire":
        return {"version": c.acquire_lease(cmd["name"], cmd["owner"], cmd["ttl"]).version}
    if op == "renew":
        return {"version": c.renew_lease(cmd["name"], cmd["owner"], cmd["version"]).version}
    if op == "start":
        c.start_generation(g, abort_outdated=cmd.get("abort", False), **_fencing(cmd))
    elif op == "put":
        c.put(cmd["key"].encode(), cmd["value"].encode(), generation_id=g, **_fencing(cmd))
    elif op == "commit":
        c.commit_generation(g, **_fencing(cmd))
    elif op == "abort":
        c.abort_generation(g, **_fencing(cmd))
    elif op == "state":
        current, next_open = c.generation_state()
        return {"current": current.decode(), "next": None if next_open is None else next_open.decode()}
    elif op == "get":
        record = c.get(cmd["key"].encode(), generation_id=cmd["g"].encode() if "g" in cmd else None)
        return {"value": None if record is None or record.value is None else record.value.decode()}
    else:
        raise ValueError(f"unknown op {op!r}")
    return {}


def main() -> None:
    parser = argparse.ArgumentParser()
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--data")
    where.add_argument("--url")
    parser.add_argument("collection")
    args = parser.parse_args()
    with ExitStack() as stack:
        if args.data is not None:
            from diffstore import Store, StoreConfig

            store = stack.enter_context(Store.open(args.data, StoreConfig(background=False)))
            collection: Collection = store.collection(args.collection)
        else:
            from diffstore.client import Client

            collection = stack.enter_context(Client(args.url)).collection(args.collection)
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            try:
                answer = run(collection, json.loads(line))
            except DiffstoreError as exc:
                answer = {"error": exc.code}
            print(json.dumps(answer), flush=True)


ROOT = Path(__file__).resolve().parents[1]
ANSWER_DEADLINE_S = 120.0


class Actor:
    """The test's side: one actor process (see the module); close it with :meth:`close` (or ``with``)."""

    def __init__(self, where: list[str], collection: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.process = subprocess.Popen(
            [sys.executable, __file__, *where, collection],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self._answer() == {"ready": True}

    def _answer(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + ANSWER_DEADLINE_S
            while not selector.select(timeout=1.0):
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"the actor gave no answer (exit code {self.process.poll()})")
        answer: dict[str, Any] = json.loads(self.process.stdout.readline())
        return answer

    def ask(self, op: str, **fields: Any) -> dict[str, Any]:
        self.send(op, **fields)
        return self._answer()

    def send(self, op: str, **fields: Any) -> None:
        """Sends a command without waiting for its answer (read it with :meth:`answer`): a command the
        actor carries out once resumed, or whose request a stalled link holds."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.process.stdin.flush()

    def answer(self) -> dict[str, Any]:
        """The answer to the oldest command sent and not yet answered."""
        return self._answer()

    def ok(self, op: str, **fields: Any) -> dict[str, Any]:
        answer = self.ask(op, **fields)
        assert "error" not in answer, (op, fields, answer)
        return answer

    def close(self) -> None:
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=ANSWER_DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()

    def __enter__(self) -> Actor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


TAKEOVER_TTL_MS = 2_000
TAKEOVER_DEADLINE_S = 60.0


def _fenced(actor: Actor, owner: str, version: int, op: str, **fields: Any) -> None:
    """``op`` under lease ``w`` at ``version``; when a slow machine let the lease expire first, renews it
    (allowed while nobody took it) and tries again, so that the sequence does not depend on timing."""
    deadline = time.monotonic() + TAKEOVER_DEADLINE_S
    while (answer := actor.ask(op, lease=["w", version], **fields)).get("error") == "leaseLost":
        assert time.monotonic() < deadline, answer
        actor.ok("renew", name="w", owner=owner, version=version)
    assert "error" not in answer, (op, answer)


def take_over(b: Actor, v1: int) -> int:
    """B stands by until the lease ``w`` (at version ``v1``) expires, then takes it: the new version."""
    deadline = time.monotonic() + TAKEOVER_DEADLINE_S
    while "version" not in (taken := b.ask("acquire", name="w", owner="B", ttl=60_000)):
        assert taken == {"error": "leaseLost"} and time.monotonic() < deadline, taken
        time.sleep(0.05)
    v2: int = taken["version"]
    assert v2 == v1 + 1
    return v2


def play_takeover(a: Actor, b: Actor) -> None:
    """The sequence of issue 25 (item 2) with two writers that use the same generation id.

    A takes lease ``w`` (version 1), starts generation ``1``, writes, and stalls past its ttl; B takes the
    lease (version 2) and starts the same ``1``. Then every write, commit, abort and start of A -- with
    its old token or with none -- is refused with ``leaseLost`` and changes nothing, and B's commit
    publishes B's records only.
    """
    v1 = a.ok("acquire", name="w", owner="A", ttl=TAKEOVER_TTL_MS)["version"]
    _fenced(a, "A", v1, "start", g="1", abort=True)
    _fenced(a, "A", v1, "put", g="1", key="a-early", value="A")
    assert a.ok("get", key="a-early", g="1") == {"value": "A"}
    # A stalls; B stands by until the lease expires, then takes it
    v2 = take_over(b, v1)
    b.ok("start", g="1", abort=True, lease=["w", v2])
    assert b.ok("get", key="a-early", g="1") == {"value": None}  # A's generation was dropped, not adopted
    b.ok("put", g="1", key="b", value="B", lease=["w", v2])
    before = b.ok("state")
    assert before == {"current": "", "next": "1"}
    old = ["w", v1]
    for op, fields in [
        ("put", {"g": "1", "key": "a-late", "value": "A", "lease": old}),
        ("put", {"g": "1", "key": "a-late", "value": "A"}),
        ("put", {"g": "1", "key": "b", "value": "A", "lease": old}),
        ("commit", {"g": "1", "lease": old}),
        ("commit", {"g": "1"}),
        ("abort", {"g": "1", "lease": old}),
        ("abort", {"g": "1"}),
        ("start", {"g": "2", "abort": True, "lease": old}),
        ("start", {"g": "2", "abort": True}),
        ("start", {"g": "1", "abort": True}),
    ]:
        assert a.ask(op, **fields) == {"error": "leaseLost"}, (op, fields)
        assert b.ok("state") == before
    assert b.ok("get", key="b", g="1") == {"value": "B"}
    assert b.ok("get", key="a-late", g="1") == {"value": None}
    b.ok("commit", g="1", lease=["w", v2])
    assert a.ok("state") == {"current": "1", "next": None}
    assert [a.ok("get", key=key)["value"] for key in ("a-early", "a-late", "b")] == [None, None, "B"]


def _b_works_on(b: Actor, v2: int) -> dict[str, Any]:
    """B, holding the lease at ``v2``, drops A's generation ``1``, commits its own ``1`` and opens ``2``;
    the state it leaves (A must change none of it)."""
    b.ok("start", g="1", abort=True, lease=["w", v2])
    b.ok("put", g="1", key="b", value="B", lease=["w", v2])
    b.ok("commit", g="1", lease=["w", v2])
    b.ok("start", g="2", lease=["w", v2])
    b.ok("put", g="2", key="b2", value="B2", lease=["w", v2])
    return b.ok("state")


def _a_is_fenced_out(a: Actor, b: Actor, v1: int, before: dict[str, Any]) -> None:
    """Every write, commit, abort, start and renewal of A with its old lease is ``leaseLost`` and changes
    nothing; then B's data is whole and B's commit publishes it."""
    old = ["w", v1]
    for op, fields in [
        ("put", {"g": "1", "key": "a-late", "value": "A", "lease": old}),
        ("commit", {"g": "1", "lease": old}),
        ("put", {"g": "2", "key": "b2", "value": "A", "lease": old}),
        ("put", {"g": "2", "key": "a-late", "value": "A", "lease": old}),
        ("commit", {"g": "2", "lease": old}),
        ("abort", {"g": "2", "lease": old}),
        ("start", {"g": "3", "abort": True, "lease": old}),
        ("renew", {"name": "w", "owner": "A", "version": v1}),
    ]:
        assert a.ask(op, **fields) == {"error": "leaseLost"}, (op, fields)
        assert b.ok("state") == before
    assert [b.ok("get", key=key, g="1")["value"] for key in ("a-early", "a-late", "b")] == [None, None, "B"]
    assert [b.ok("get", key=key, g="2")["value"] for key in ("a-late", "b", "b2")] == [None, "B", "B2"]
    b.ok("commit", g="2", lease=["w", b.ok("renew", name="w", owner="B", version=v1 + 1)["version"]])
    assert a.ok("state") == {"current": "2", "next": None}
    assert [a.ok("get", key=key)["value"] for key in ("a-early", "a-late", "b", "b2")] == [
        None,
        None,
        "B",
        "B2",
    ]


def play_paused_takeover(a: Actor, b: Actor) -> None:
    """A pauses (SIGSTOP) between two writes of its generation, with its next write already decided (sent,
    carried out once it runs again); B takes the lease over meanwhile, commits and opens a generation. A,
    resumed, goes on as if nothing happened: its pending write and everything after is ``leaseLost``,
    and B's data is whole (issue 25: leases under pauses)."""
    v1 = a.ok("acquire", name="w", owner="A", ttl=TAKEOVER_TTL_MS)["version"]
    _fenced(a, "A", v1, "start", g="1", abort=True)
    _fenced(a, "A", v1, "put", g="1", key="a-early", value="A")
    with paused(a.process):
        a.send("put", g="1", key="a-late", value="A", lease=["w", v1])  # its next write, carried out later
        v2 = take_over(b, v1)
        before = _b_works_on(b, v2)
    assert a.answer() == {"error": "leaseLost"}
    assert b.ok("state") == before
    _a_is_fenced_out(a, b, v1, before)


def play_takeover_over_a_stalled_link(a: Actor, b: Actor, link: TcpProxy) -> None:
    """A reaches the server through ``link``. Its write hangs in the stalled link while its lease expires
    and B takes over; released, the write arrives late and is ``leaseLost``. Its commit then hangs in the
    link and the link is cut: A's client reports the server unreachable (``storageError``), and A's retry
    is ``leaseLost``. Nothing of A lands; B's data is whole (issue 25: leases under link faults)."""
    v1 = a.ok("acquire", name="w", owner="A", ttl=TAKEOVER_TTL_MS)["version"]
    _fenced(a, "A", v1, "start", g="1", abort=True)
    _fenced(a, "A", v1, "put", g="1", key="a-early", value="A")
    link.stall()
    a.send("put", g="1", key="a-late", value="A", lease=["w", v1])
    wait_until(lambda: link.held > 0, TAKEOVER_DEADLINE_S, what="A's write held by the stalled link")
    v2 = take_over(b, v1)
    before = _b_works_on(b, v2)
    link.passing()  # A's write arrives, after the takeover
    assert a.answer() == {"error": "leaseLost"}
    assert b.ok("state") == before
    link.stall()
    a.send("commit", g="1", lease=["w", v1])
    wait_until(lambda: link.held > 0, TAKEOVER_DEADLINE_S, what="A's commit held by the stalled link")
    link.cut()
    assert a.answer() == {"error": "storageError"}  # the request never reached the server
    link.accept()
    link.passing()
    assert b.ok("state") == before
    _a_is_fenced_out(a, b, v1, before)


if __name__ == "__main__":
    main()
