"""A full file system, for real: a small tmpfs of its own, filled while a store or the stream server writes.

Both durability modes. The store runs in a subprocess (``full_disk_worker.py``) so that a SIGBUS — what an
unsynced store writing through LMDB's memory map used to die of — fails the test instead of killing pytest.
Mounting needs root (``mount -t tmpfs``); without it the tests are skipped with the reason.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import close_pipes

WORKER = Path(__file__).with_name("full_disk_worker.py")
FS_SIZE = "8m"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A fresh 8 MiB tmpfs mounted on a directory of ``tmp_path`` (unmounted afterwards)."""
    mount_point = tmp_path / "small-fs"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={FS_SIZE}", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(
            "FULL-DISK TESTS NOT RUN: cannot mount a small tmpfs here (needs root / CAP_SYS_ADMIN): "
            + mounted.stderr.strip()
        )
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "--lazy", str(mount_point)], check=True)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _fill(path: Path) -> None:
    with open(path, "wb") as filler:
        try:
            while True:
                filler.write(b"\0" * 65536)
                filler.flush()
        except OSError:
            pass


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "no-sync"])
def test_a_full_disk_refuses_writes_keeps_reads_and_recovers(small_fs: Path, sync: bool) -> None:
    done = subprocess.run(
        [sys.executable, str(WORKER), str(small_fs), "1" if sync else "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert done.returncode != -signal.SIGBUS, "the store died of SIGBUS on the full disk"
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["big"] == "storageFull"
    assert seen["more"] == ["storageFull"]  # refused every time, never another error
    assert seen["tiny"] in ("ok", "storageFull")
    assert seen["reads_unchanged"] and seen["reopened_reads_unchanged"]
    assert seen["after_space_returns"] == "ok"
    assert seen["count_after"] == 50 + 2000


@pytest.mark.parametrize(
    "command",
    [["serve", "--port", "0"], ["serve", "--port", "0", "--no-sync"], ["streams", "serve", "--port", "0"]],
    ids=["serve", "serve-no-sync", "streams-serve"],
)
def test_starting_on_a_full_disk_says_so_in_one_line(small_fs: Path, command: list[str]) -> None:
    _fill(small_fs / "filler")
    done = subprocess.run(
        [sys.executable, "-m", "diffstore.cli", *command, "--data", str(small_fs / "data")],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
    )
    assert done.returncode != -signal.SIGBUS, "the server died of SIGBUS on the full disk"
    assert done.returncode == 1, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "no space left" in lines[0] and str(small_fs) in lines[0]


def test_the_stream_server_refuses_appends_on_a_full_disk_and_recovers(small_fs: Path) -> None:
    import grpc

    from diffstore.streams._proto import hstream_pb2 as pb
    from diffstore.streams._proto import hstream_pb2_grpc as pb_grpc

    def batch(payload: bytes) -> pb.BatchedRecord:
        records = pb.BatchHStreamRecords(records=[pb.HStreamRecord(payload=payload)])
        return pb.BatchedRecord(batchSize=1, payload=records.SerializeToString())

    command = [sys.executable, "-m", "diffstore.cli", "streams", "serve", "--port", "0"]
    process = subprocess.Popen(
        [*command, "--data", str(small_fs / "data")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # the server prints its address once it serves (or exits)
        assert "hstream://" in line, process.stderr.read() if process.stderr else line
        address = line.split("hstream://", 1)[1].split()[0]
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.HStreamApiStub(channel)
            stub.CreateStream(pb.Stream(streamName="s", replicationFactor=1, shardCount=1), timeout=20)
            shard = stub.ListShards(pb.ListShardsRequest(streamName="s"), timeout=20).shards[0].shardId
            stub.Append(pb.AppendRequest(streamName="s", shardId=shard, records=batch(b"first")), timeout=20)

            def tail() -> int:
                request = pb.GetTailRecordIdRequest(streamName="s", shardId=shard)
                return int(stub.GetTailRecordId(request, timeout=20).tailRecordId.batchId)

            before = tail()
            _fill(small_fs / "filler")
            big = pb.AppendRequest(streamName="s", shardId=shard, records=batch(os.urandom(1 << 20)))
            with pytest.raises(grpc.RpcError) as refused:
                stub.Append(big, timeout=20)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
            assert tail() == before
            (small_fs / "filler").unlink()
            stub.Append(big, timeout=20)
            assert tail() > before
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        close_pipes(process)
        assert process.returncode != -signal.SIGBUS
