"""Two ``diffstore transform --watch`` runners with a lease, each reaching the server through its own TCP
proxy (``tests/faults.py``), while the sources are written throughout. The active runner's link is faulted
in turn, each time while it works:

- **stalled** inside a held round (every byte both ways held, connections open) until the standby takes
  over, then released: the round's writes and commit, and its lease renewals, arrive late and are refused;
- **cut** inside a held round (connections reset, new ones refused) until the standby takes over, then
  accepted again;
- **delayed** (each chunk 100 ms late) for a round: the runner may keep its lease or lose it.

The job and the checks are those of ``transform_runners.py``: C equals the recomputation from A and B
(every change exactly once, nothing stale), its lineage is one unbroken chain whose lease versions never go
back, and a runner whose link came back committed nothing until it was active again.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest
from transform_runners import (
    ROUND_S,
    Runners,
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
from tests.faults import TcpProxy
from tests.helpers import wait_until

pytest.importorskip("pyspark")

DELAY_MS = 100


def fault_in_round(runners: Runners, proxies: list[TcpProxy], fault: str) -> tuple[int, int]:
    """Once the active runner committed a round, holds its next one (its generation open), faults its
    link (``stall`` or ``cut``), lets the round go on into the fault, waits until the other runner took
    over, ends the fault and waits until the faulted runner stands by; returns it and its log length when
    the fault began."""
    active, stderr = runners.active(), runners.stderr
    done = names_of(stderr[active]).count("round committed")  # a round of its own first: its version shows
    wait_until(
        lambda: names_of(stderr[active]).count("round committed") > done,
        ROUND_S,
        0.05,
        "the active runner's round",
    )
    holding = runners.log.read_text().count("holding")
    runners.hold.touch()
    wait_until(lambda: runners.log.read_text().count("holding") > holding, ROUND_S, 0.05, "a held round")
    taken = names_of(stderr[1 - active]).count("active")
    before = len(events(stderr[active]))
    getattr(proxies[active], fault)()
    runners.hold.unlink()
    wait_until(
        lambda: names_of(stderr[1 - active]).count("active") > taken,
        ROUND_S,
        0.05,
        "the standby to take over",
    )
    if fault == "stall":
        proxies[active].passing()
    else:
        proxies[active].accept()
    wait_until(
        lambda: last_state(stderr[active]) != "active", ROUND_S, 0.05, f"the {fault} runner to stand by"
    )
    return active, before


def test_runners_behind_stalled_cut_and_slow_links_apply_every_change_once(
    tmp_path: Path, server_url: str, store: Store, names: dict[str, str]
) -> None:
    for name in (names["A"], names["B"], names["C"]):
        store.create_collection(name, manual=True)
    writer = SourceWriter(store, names["A"], names["B"])
    upstream = urlsplit(server_url).netloc
    fenced: list[tuple[int, int]] = []  # (runner, its log lines before its link was faulted)
    try:
        with TcpProxy(upstream) as p0, TcpProxy(upstream) as p1:
            proxies = [p0, p1]
            with running(tmp_path, [f"http://{p.address}" for p in proxies], names) as runners:
                stderr = runners.stderr
                runners.held_runner()
                runners.hold.unlink()  # the first round goes on; faults hold rounds of their own
                writer.start()
                fenced.append(fault_in_round(runners, proxies, "stall"))
                fenced.append(fault_in_round(runners, proxies, "cut"))
                # slow: a round through a link that delays every chunk (it may keep the lease, or not)
                active = runners.active()
                done = names_of(stderr[active]).count("round committed")
                taken = names_of(stderr[1 - active]).count("active")
                proxies[active].delay(DELAY_MS)
                wait_until(
                    lambda: (
                        names_of(stderr[active]).count("round committed") > done
                        or names_of(stderr[1 - active]).count("active") > taken
                    ),
                    ROUND_S,
                    0.05,
                    "a round over the slow link, or a takeover",
                )
                proxies[active].passing()
                heads = finish_writing(store, writer, names)
    finally:
        writer.stop.set()
    assert writer.commits >= 3
    assert_exactly_once(store, writer, names, heads, handovers=3)
    for runner, before in fenced:
        assert_fenced_while_faulted(runners.stderr[runner], before)
    assert p0.connections and p1.connections  # every runner's traffic went through its proxy
