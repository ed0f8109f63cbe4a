"""The official ``hstreamdb`` 0.5.0 client (async API) against the embedded server, unchanged.

Its generated module ``HStream.Server.HStreamApi_pb2`` defines the same protobuf symbols as ours, and both
cannot be loaded in one process; so pytest runs the server in-process and this very file, as a script, runs
the client in a subprocess that prints a JSON report.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve()


# --- the client side (runs in the subprocess) --------------------------------------------------------------


async def _consume(client: Any, subscription: str, name: str, want: int, ack: Any = True) -> list[Any]:
    """Receives ``want`` records (acking those ``ack`` selects), then stops the consumer."""
    got: list[Any] = []

    async def process(ack_fn: Any, stop_fn: Any, records: Any) -> None:
        records = list(records)
        got.extend(records)
        selected = [r.id for r in records if ack is True or ack(r)]
        if selected:
            await ack_fn(selected)
        if len(got) >= want:
            await stop_fn()

    consumer = client.new_consumer(name, subscription, process)
    await asyncio.wait_for(consumer.start(), timeout=30)
    return got


async def _retry(coro_fn: Any, code: Any) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            return await coro_fn()
        except Exception as exc:  # grpc.aio.AioRpcError
            if getattr(exc, "code", lambda: None)() != code or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.01)


async def client_scenario(host: str, port: int) -> dict[str, Any]:
    import grpc
    from hstreamdb import insecure_client
    from hstreamdb.aio.producer import BufferedProducer
    from hstreamdb.types import SpecialOffset
    from hstreamdb.utils import find_shard_id

    report: dict[str, Any] = {}
    async with await insecure_client(host=host, port=port) as client:
        await client.create_stream("s", shard_count=2)
        report["streams"] = [s.name for s in await client.list_streams()]
        shards = await client.list_shards("s")
        report["shards"] = len(shards)
        appended: dict[str, Any] = {}
        for label, payloads, key, compression in (
            ("raw", [b"r0", b"r1"], None, None),
            ("str", ["s0", "s1"], "k1", None),
            ("json", [{"a": 1.0}, {"b": "x"}], "k2", None),
            ("gzip", [b"g0", "g1", {"g": 2.0}], "k3", "gzip"),
        ):
            ids = list(await client.append("s", payloads, key=key, compresstype=compression))
            appended[label] = (ids, find_shard_id(shards, key=key))

        class Callback(BufferedProducer.AppendCallback):
            ok = 0

            # the client calls these on the class itself, so they are static
            @staticmethod
            def on_success(stream_name: str, payloads: Any, stream_keyid: int) -> None:
                Callback.ok += len(payloads)

            @staticmethod
            def on_fail(stream_name: str, payloads: Any, stream_keyid: int, e: Exception) -> None:
                raise e

        producer = client.new_producer(
            append_callback=Callback, size_trigger=64, time_trigger=0.02, workers=2
        )
        for i in range(20):
            await producer.append("s", f"p{i}", key=f"pk{i % 4}")
        await producer.wait_and_close()
        report["producer_ok"] = Callback.ok

        await client.create_subscription(
            "sub", "s", ack_timeout=600, max_unacks=10000, offset=SpecialOffset.EARLIEST
        )
        report["exists"] = await client.does_subscription_exist("sub")
        report["subscriptions"] = [s.subscription_id for s in await client.list_subscriptions()]
        records = await _consume(client, "sub", "c1", want=29)
        report["received"] = sorted(
            [r.payload.decode() if isinstance(r.payload, bytes) else json.dumps(r.payload) for r in records]
        )
        by_id = {tuple(r.id): r for r in records}
        report["ids_match"] = all(
            tuple(i) in by_id and i.shard_id == shard for ids, shard in appended.values() for i in ids
        )
        report["keys"] = sorted({r.header.key or "" for r in records})

        try:
            await _consume(client, "missing", "c1", want=1)
            report["missing"] = "no error"
        except grpc.aio.AioRpcError as exc:
            report["missing"] = exc.code().name

        # redelivery: ack every other record, the rest comes again after the ack timeout (1 unit)
        await client.create_subscription(
            "redo", "s", ack_timeout=1, max_unacks=10000, offset=SpecialOffset.EARLIEST
        )
        expected = sorted(tuple(r.id) for r in records if r.id.batch_index % 2 == 0)
        first: set[tuple[int, int, int]] = set()
        again: list[tuple[int, int, int]] = []

        async def process_all(ack_fn: Any, stop_fn: Any, batch: Any) -> None:
            batch = list(batch)
            if len(first) < len(records):
                first.update(tuple(r.id) for r in batch)
                odd = [r.id for r in batch if r.id.batch_index % 2 == 1]
                if odd:
                    await ack_fn(odd)
            else:
                again.extend(tuple(r.id) for r in batch)
                await ack_fn([r.id for r in batch])
            if len(again) >= len(expected):
                await stop_fn()

        consumer = client.new_consumer("c2", "redo", process_all)
        await asyncio.wait_for(consumer.start(), timeout=30)
        report["redelivered_only_unacked"] = sorted(again) == expected

        await _retry(lambda: client.delete_subscription("sub"), grpc.StatusCode.FAILED_PRECONDITION)
        await _retry(lambda: client.delete_subscription("redo"), grpc.StatusCode.FAILED_PRECONDITION)
        report["after_delete"] = await client.does_subscription_exist("sub")
        await client.delete_stream("s")
        report["streams_after"] = [s.name for s in await client.list_streams()]
    return report


# --- the test side (runs under pytest) ---------------------------------------------------------------------

# find_spec, not importorskip: importing hstreamdb here would clash with our generated protos.
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("hstreamdb") is None, reason="hstreamdb not installed"
)


def test_official_client_against_the_embedded_server(stream_server: Any) -> None:
    host, port = stream_server.address.rsplit(":", 1)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), host, port], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["streams"] == ["s"] and report["shards"] == 2
    assert report["producer_ok"] == 20
    assert report["exists"] is True and report["subscriptions"] == ["sub"]
    expected = ["r0", "r1", "s0", "s1", '{"a": 1.0}', '{"b": "x"}', "g0", "g1", '{"g": 2.0}']
    assert report["received"] == sorted(expected + [f"p{i}" for i in range(20)])
    assert report["ids_match"] is True
    assert report["keys"] == ["", "k1", "k2", "k3", "pk0", "pk1", "pk2", "pk3"]
    assert report["missing"] == "NOT_FOUND"
    assert report["redelivered_only_unacked"] is True
    assert report["after_delete"] is False and report["streams_after"] == []


if __name__ == "__main__":
    print(json.dumps(asyncio.run(client_scenario(sys.argv[1], int(sys.argv[2])))))
