"""``diffstore streams serve`` as a real process: it serves on the advertised address and stops on SIGTERM."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from diffstore.streams import cli
from diffstore.streams._proto import hstream_pb2 as pb
from diffstore.streams._proto import hstream_pb2_grpc as pb_grpc
from tests.helpers import close_pipes


def test_streams_serve_is_registered_with_its_options() -> None:
    parser = argparse.ArgumentParser()
    cli.add_commands(parser.add_subparsers())
    args = parser.parse_args(["streams", "serve", "--data", "d", "--port", "7000", "--resend-tick", "0.01"])
    assert (args.data, args.port, args.host, args.resend_tick) == (Path("d"), 7000, "127.0.0.1", 0.01)
    assert args.func is cli._serve_command
    assert parser.parse_args(["streams"]).func(args) == 2


def test_serve_process_answers_and_stops_on_sigterm(tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "diffstore.streams.cli",
        "streams",
        "serve",
        "--data",
        str(tmp_path),
        "--port",
        "0",
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # blocks until the server printed its address (or exited)
        assert "hstream://" in line, process.stderr.read() if process.stderr else line
        address = line.split("hstream://", 1)[1].split()[0]
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.HStreamApiStub(channel)
            assert stub.Echo(pb.EchoRequest(msg="ping"), timeout=20).msg == "ping"
            stub.CreateStream(pb.Stream(streamName="s", replicationFactor=1, shardCount=1), timeout=20)
            # a second server on the same directory refuses to start, and the first one keeps serving
            second = subprocess.run(command, capture_output=True, text=True, timeout=60)
            assert second.returncode == 1 and second.stdout == ""
            assert second.stderr.count("\n") == 1 and "already served" in second.stderr, second.stderr
            names = [s.streamName for s in stub.ListStreams(pb.ListStreamsRequest(), timeout=20).streams]
            assert names == ["s"]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert (tmp_path / "data.mdb").exists()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        close_pipes(process)


def test_map_size_takes_human_sizes_and_refuses_others(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    cli.add_commands(parser.add_subparsers())
    assert parser.parse_args(["streams", "serve", "--map-size", "64MiB"]).map_size == 64 << 20
    assert parser.parse_args(["streams", "serve"]).map_size == 1 << 40
    ingest = parser.parse_args(
        ["ingest", "--hstream", "hstream://h", "--subscription", "s", "--collection", "c", "--data", "d"]
        + ["--map-size", "2GiB"]
    )
    assert ingest.map_size == 2 << 30
    done = subprocess.run(
        [sys.executable, "-m", "diffstore.streams.cli", "streams", "serve", "--data", str(tmp_path)]
        + ["--map-size", "12 parsecs"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "not a size" in done.stderr
    too_small = subprocess.run(
        [sys.executable, "-m", "diffstore.streams.cli", "streams", "serve", "--data", str(tmp_path)]
        + ["--map-size", "4KiB"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert too_small.returncode == 2
    assert too_small.stderr.strip().splitlines() == [too_small.stderr.strip()]  # one line, no traceback
    assert "map_size" in too_small.stderr
    assert not (tmp_path / "data.mdb").exists()


def test_ingest_map_size_reaches_the_embedded_store(tmp_path: Path) -> None:
    from diffstore.streams.sinks import EngineSink

    sink = EngineSink.open(tmp_path / "store", "c", create=True, map_size=8 << 20)
    try:
        assert sink._closer.config.map_size == 8 << 20  # type: ignore[attr-defined]
    finally:
        sink.close()


def test_ingest_map_size_needs_the_embedded_store() -> None:
    from diffstore.streams import ingest_cli

    args = argparse.Namespace(map_size=1 << 30, data=None, url="http://127.0.0.1:1", collection="c")
    with pytest.raises(ValueError, match="--map-size"):
        ingest_cli._open_sink(args)
