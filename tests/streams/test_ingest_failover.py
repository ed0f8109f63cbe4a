"""``diffstore ingest --url PRIMARY,REPLICA`` rides out a promotion of the replica (the old primary steps
down: it refuses writes with 409 ``fenced``): both ingestors keep running, the active one follows the new
leader, and C on the new leader holds every record exactly once (``check_exactly_once``)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from test_ingest_ha import WAIT_S, holder_pid
from test_ingest_outages import Flow, StreamsServer, finish, servers, start_pipeline

from diffstore.client import _calls as calls
from diffstore.streams.client import StreamClient
from tests.helpers import wait_until
from tests.replica.conftest import Server

__all__ = ["servers"]  # the fixture, shared with test_ingest_outages


def test_an_ingestor_given_both_urls_follows_a_promotion_exactly_once(
    tmp_path: Path, servers: list[Server | StreamsServer]
) -> None:
    streams = StreamsServer(tmp_path / "hstream")
    servers.append(streams.start())
    primary = Server(tmp_path / "primary")
    servers.append(primary.start())
    replica = Server(tmp_path / "replica", "--replica-of", primary.url)
    servers.append(replica.start())
    ingestors = start_pipeline(tmp_path, streams.url, f"{primary.url},{replica.url}")
    try:
        with StreamClient(streams.url) as client:
            flow = Flow(client, seed=50).start()
            ingestors.next_commit(time.monotonic() + WAIT_S)
            with primary.client() as p, replica.client() as r:
                assert holder_pid(p.collection("C")) in ingestors.alive
                # promotion waits for the replica to catch up; C must be there to be followed at all
                wait_until(lambda: "C" in [i.name for i in r.collections()], WAIT_S, what="C on the replica")
            ingestors.drain()
            command = [
                sys.executable,
                "-m",
                "diffstore.cli",
                "promote",
                "--url",
                replica.url,
                "--wait",
                "120",
            ]
            promoted = subprocess.run(command, capture_output=True, text=True, timeout=300)
            assert promoted.returncode == 0, promoted.stderr
            ingestors.next_commit(time.monotonic() + WAIT_S)  # the pipeline moves again, on the new leader
            flow.finish()
        with primary.client() as p:
            assert p.execute(calls.replication())["role"] == "fenced"
        finish(ingestors, flow, replica.url)
    finally:
        ingestors.close()
