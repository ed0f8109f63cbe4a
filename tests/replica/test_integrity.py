"""A replica process stores the digests of its primary process (SPEC §9 Integrity), and ``diffstore check
--url REPLICA --against PRIMARY`` says so."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers import wait_until

from .compare import caught_up
from .conftest import Server

DEADLINE_S = 120.0


def test_a_replica_holds_the_digests_of_its_primary(primary: Server, replica: Server) -> None:
    with primary.client() as p, replica.client() as r:
        a = p.create_collection("A")
        for n in range(1, 5):
            g = b"%02d" % n
            items = [(b"k%d" % i, b"v%d-%d" % (i, n)) for i in range(n, n + 5)] + [(b"k%d" % (n - 1), None)]
            a.write_generation(g, items)
        auto = p.create_collection("B", manual=False)
        auto.put_many([(b"x", b"1"), (b"y", b"2")])
        wait_until(lambda: auto.generation_state()[0] != b"\x00" * 8, DEADLINE_S, what="B's automatic commit")
        wait_until(lambda: caught_up(p, r), DEADLINE_S, what="the replica to catch up")
        for name in ("A", "B"):
            mine, _ = r.collection(name).digests()
            theirs, _ = p.collection(name).digests()
            shared = {d.generation_id for d in mine} & {d.generation_id for d in theirs}
            assert shared and {d for d in mine if d.generation_id in shared} == {
                d for d in theirs if d.generation_id in shared
            }
        done = subprocess.run(
            [sys.executable, "-m", "diffstore", "check", "--url", replica.url, "--against", primary.url],
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
            env=os.environ,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "A: equal (" in done.stdout and "B: equal (" in done.stdout
