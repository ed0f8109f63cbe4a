"""``diffstore streams create|ls|rm|subscribe|produce|consume`` against a real embedded stream server."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from diffstore.cli import main
from diffstore.streams.client import StreamClient
from diffstore.streams.server import ServerThread, StreamServerConfig

WAIT_S = 20.0  # upper bound of any wait; tests never sleep for a fixed time


def run(capsys: pytest.CaptureFixture[str], server: ServerThread, *argv: str) -> tuple[int, str, str]:
    code = main(["streams", *argv, "--hstream", server.url])
    out, err = capsys.readouterr()
    return code, out, err


def cli(*argv: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "diffstore", "streams", *argv],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=WAIT_S * 2,
    )


def test_create_ls_subscribe_produce_consume_rm(
    capsys: pytest.CaptureFixture[str], stream_server: ServerThread
) -> None:
    assert run(capsys, stream_server, "create", "orders", "--shards", "2") == (
        0,
        "created stream orders (2 shards)\n",
        "",
    )
    assert run(capsys, stream_server, "ls") == (0, "NAME\tSHARDS\norders\t2\n", "")
    assert run(capsys, stream_server, "ls", "--no-headers") == (0, "orders\t2\n", "")
    code, out, _ = run(capsys, stream_server, "ls", "--format", "json")
    assert json.loads(out) == {"name": "orders", "shards": 2}
    assert run(capsys, stream_server, "subscribe", "orders", "--subscription", "s1")[0] == 0
    produced = cli(
        "produce", "orders", "--key", "k", "--hstream", stream_server.url, stdin="one\ntwo\n\xff\n"
    )
    assert produced.returncode == 0, produced.stderr
    assert produced.stdout == "produced 3 records to orders\n"
    code, out, _ = run(capsys, stream_server, "consume", "s1", "--count", "3")
    # one partition key: one shard, so the records come in the order produced
    assert (code, out) == (0, "k\tone\nk\ttwo\nk\tÿ\n")
    # consumed records were acknowledged: nothing is left for the subscription
    code, out, _ = run(capsys, stream_server, "consume", "s1", "--idle", "0.5", "--format", "json")
    assert (code, out) == (0, "")
    one = cli("produce", "orders", "--hstream", stream_server.url, stdin="four\n")
    assert (one.returncode, one.stdout) == (0, "produced 1 record to orders\n"), one.stderr  # not "1 records"
    assert run(capsys, stream_server, "rm", "orders", "--force") == (0, "removed stream orders\n", "")
    assert run(capsys, stream_server, "ls") == (0, "", "")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (("create", "dup"), "(conflict)"),
        (("subscribe", "missing", "--subscription", "s"), "stream missing not found"),
        (("consume", "nosub", "--count", "1"), "(notFound)"),
        (("produce", "missing"), "(notFound)"),
    ],
)
def test_failures_are_one_line(
    capsys: pytest.CaptureFixture[str], stream_server: ServerThread, argv: tuple[str, ...], expected: str
) -> None:
    assert run(capsys, stream_server, "create", "dup")[0] == 0
    code, out, err = run(capsys, stream_server, *argv)
    assert code == 1 and out == ""
    assert expected in err and err.count("\n") == 1 and err.startswith(f"diffstore streams {argv[0]}: ")
    assert run(capsys, stream_server, "ls", "--no-headers")[1] == "dup\t1\n"


def test_a_bad_or_unreachable_url_is_one_line(tmp_path: Path) -> None:
    wrong = cli("ls", "--hstream", "http://127.0.0.1:6570")
    assert wrong.returncode == 1 and "Traceback" not in wrong.stderr
    assert wrong.stderr.startswith(
        "diffstore streams ls: --hstream http://127.0.0.1:6570: not an hstream URL"
    )
    server = ServerThread(
        StreamServerConfig(data_dir=tmp_path / "h", host="127.0.0.1", port=0, sync=False)
    ).start()
    url = server.url
    server.stop()
    down = cli("ls", "--hstream", url, "--timeout", "1")
    assert down.returncode == 1 and "Traceback" not in down.stderr
    assert f"cannot reach an HStream server at {url}" in down.stderr and down.stderr.count("\n") == 1


def test_split_adds_a_shard_and_a_bad_split_changes_nothing(
    capsys: pytest.CaptureFixture[str], stream_server: ServerThread
) -> None:
    assert run(capsys, stream_server, "create", "orders")[0] == 0
    code, out, _ = run(capsys, stream_server, "ls", "--format", "json")
    assert json.loads(out)["shards"] == 1
    with StreamClient(stream_server.url) as client:
        (only,) = client.list_shards("orders")
    code, out, err = run(
        capsys, stream_server, "split", "orders", "--shard", str(only.shard_id), "--format", "json"
    )
    assert (code, err) == (0, "")
    shards = [json.loads(line) for line in out.splitlines()]
    assert len(shards) == 2
    # the two halves cover the whole hash space, the lower one kept by the split shard
    lower, upper = shards
    assert lower["shard"] == only.shard_id and int(lower["startHash"], 16) == 0
    assert int(upper["startHash"], 16) == int(lower["endHash"], 16) + 1
    assert int(upper["endHash"], 16) == 2**128 - 1
    assert run(capsys, stream_server, "ls", "--no-headers")[1] == "orders\t2\n"
    # without --shard, one of the two widest ranges (both halves) is split: three contiguous quarters/half
    code, out, _ = run(capsys, stream_server, "split", "orders", "--format", "json")
    after = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and len(after) == 3
    widths = sorted(int(s["endHash"], 16) - int(s["startHash"], 16) + 1 for s in after)
    assert widths == [2**126, 2**126, 2**127]
    assert all(int(b["startHash"], 16) == int(a["endHash"], 16) + 1 for a, b in itertools.pairwise(after))
    assert run(capsys, stream_server, "ls", "--no-headers")[1] == "orders\t3\n"
    # an unknown shard or stream: one line, exit 1, the stream as it was
    for argv in (("split", "orders", "--shard", "999999"), ("split", "missing", "--shard", "0")):
        code, out, err = run(capsys, stream_server, *argv)
        assert (
            code == 1 and out == "" and err.count("\n") == 1 and err.startswith("diffstore streams split: ")
        )
    assert run(capsys, stream_server, "ls", "--no-headers")[1] == "orders\t3\n"
