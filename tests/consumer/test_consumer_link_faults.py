"""Two consumer processes with a lease, each reaching the server through its own TCP proxy: the active one's
link is delayed, stalled and cut (connections reset, new ones refused) until the standby takes over, then
restored, several times, while the source is written throughout.

The same exactly-once checks as the pause test: the checkpoint's lineage is one unbroken chain of windows
from the start to A's head with lease versions that never go back, and O ends equal to A.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.faults import TcpProxy
from tests.helpers import running_server, wait_until

from .test_consumer_pause import (
    DEADLINE_S,
    KEYS,
    TTL_MS,
    WORKER,
    SourceWriter,
    assert_one_chain,
    finish_and_read_chain,
)

FAULTS = ("cut", "stall", "cut")

# run() rides out a network error by itself (docs/client.md, "Outages"); the loop here only reports an
# error that would still escape it (it must not: the test's checks would then show a gap).
RETRYING_WORKER = WORKER.replace(
    "    consumer.run()\n",
    "    from diffstore.errors import StorageError\n"
    "    while True:\n"
    "        try:\n"
    "            consumer.run()\n"
    "        except StorageError as exc:\n"
    "            say('error', pid, type(exc).__name__)\n"
    "            time.sleep(0.2)\n",
)
assert RETRYING_WORKER != WORKER


def test_consumers_whose_link_is_cut_or_stalled_hand_over_exactly_once(tmp_path: Path) -> None:
    script, log = tmp_path / "worker.py", tmp_path / "log"
    script.write_text(RETRYING_WORKER)
    log.touch()
    no_hold = tmp_path / "never-held"

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
        upstream = live.url.removeprefix("http://")
        proxies: dict[str, TcpProxy] = {}
        procs: dict[str, subprocess.Popen[bytes]] = {}
        try:
            for _ in range(2):
                proxy = TcpProxy(upstream).start()
                argv = [
                    sys.executable,
                    str(script),
                    f"http://{proxy.address}",
                    str(log),
                    str(no_hold),
                    str(TTL_MS),
                ]
                proc = subprocess.Popen(argv, env=env)
                procs[str(proc.pid)], proxies[str(proc.pid)] = proc, proxy
            wait_until(
                lambda: len([w for w in lines() if w[0] == "ready"]) == 2,
                timeout=DEADLINE_S,
                what="both ready",
            )
            wait_until(lambda: any(w[0] == "end" for w in lines()), timeout=DEADLINE_S, what="a first window")
            checkpoint = client.collection("cp")  # made by the consumers
            writer.start()
            for fault in FAULTS:
                seen = len(lines())
                wait_until(
                    lambda: any(w[0] == "end" for w in lines()[seen:]),  # noqa: B023
                    timeout=DEADLINE_S,
                    what="a window",
                )
                active = next(w[1] for w in reversed(lines()) if w[0] == "end")
                other = next(pid for pid in procs if pid != active)
                version = checkpoint.leases()[0].version
                proxy = proxies[active]
                proxy.delay(50)
                if fault == "cut":
                    proxy.cut(refuse=True)
                else:
                    proxy.stall()
                wait_until(
                    lambda: checkpoint.leases()[0].version > version,  # noqa: B023
                    timeout=DEADLINE_S,
                    what="the standby to take the lease",
                )
                resumed_at = len(lines())
                wait_until(
                    lambda: ends_of(other, resumed_at) > 0,  # noqa: B023
                    timeout=DEADLINE_S,
                    what="the new owner's window",
                )
                if fault == "cut":
                    proxy.accept()
                proxy.passing()  # a stalled request now arrives late: fenced, it changes nothing
            head, chain = finish_and_read_chain(client, writer, checkpoint)
        finally:
            writer.stop.set()
            for proc in procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(DEADLINE_S)
            for proxy in proxies.values():
                proxy.close()
    assert writer.commits > len(FAULTS)
    assert_one_chain(chain, head, owners=len(FAULTS) + 1)  # a new owner per fault
