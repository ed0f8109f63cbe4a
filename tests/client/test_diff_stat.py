"""``diffstore diff --stat`` against a real server: the counts of inserted, updated and deleted keys over
several pages, equal to the lines ``diff`` prints, in text and JSON; its failures are ``diff``'s."""

from __future__ import annotations

import json

import pytest

from diffstore.client import Client

from .conftest import LiveServer
from .test_commands import cli, run

KEYS = 2_500  # several diff pages


def _history(server: LiveServer) -> None:
    """C: g1 writes KEYS keys; g2 updates the even ones below 1,000, deletes the odd ones below 1,000 and
    inserts 7 new ones."""
    with Client(server.url) as client:
        c = client.create_collection("C")
        c.start_generation(b"g1")
        c.put_many([(b"k%05d" % n, b"1") for n in range(KEYS)], generation_id=b"g1")
        c.commit_generation(b"g1")
        c.start_generation(b"g2")
        changes = [(b"k%05d" % n, b"2" if n % 2 == 0 else None) for n in range(1000)]
        c.put_many(changes + [(b"new%d" % n, b"x") for n in range(7)], generation_id=b"g2")
        c.commit_generation(b"g2")


def test_stat_counts_each_kind(capsys: pytest.CaptureFixture[str], server: LiveServer) -> None:
    _history(server)
    assert run(capsys, server, "diff", "C", "--from", "g1", "--stat") == (
        0,
        "7 inserted, 500 updated, 500 deleted\n",
        "",
    )
    assert run(capsys, server, "diff", "C", "--from", "", "--to", "g1", "--stat")[1] == (
        f"{KEYS} inserted, 0 updated, 0 deleted\n"
    )
    code, out, _ = run(capsys, server, "diff", "C", "--from", "~2", "--stat", "--format", "json")
    assert (code, json.loads(out)) == (0, {"inserted": KEYS - 500 + 7, "updated": 0, "deleted": 0})
    # the same counts as the lines diff prints
    code, out, _ = run(capsys, server, "diff", "C", "--from", "g1")
    marks = [line[0] for line in out.splitlines()]
    assert (marks.count("+"), marks.count("~"), marks.count("-")) == (7, 500, 500)
    assert (
        run(capsys, server, "diff", "C", "--from", "@current", "--stat")[1]
        == "0 inserted, 0 updated, 0 deleted\n"
    )


def test_stat_fails_as_diff_does(server: LiveServer) -> None:
    _history(server)
    done = cli("diff", "C", "--from", "g1", "--to", "zzz", "--stat", "--url", server.url)
    assert done.returncode == 1 and done.stdout == "" and done.stderr.count("\n") == 1
    assert "noSuchGeneration" in done.stderr
    done = cli("diff", "--help")
    assert done.returncode == 0 and "--stat" in done.stdout
