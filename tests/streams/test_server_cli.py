"""``diffstore streams serve`` as a real process: it serves on the advertised address and stops on SIGTERM."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from pathlib import Path

import grpc

from diffstore.streams import cli
from diffstore.streams._proto import hstream_pb2 as pb
from diffstore.streams._proto import hstream_pb2_grpc as pb_grpc


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
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert (tmp_path / "data.mdb").exists()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
