"""``diffstore diff --stat`` against a real server: the counts of inserted, updated and deleted keys over
several pages, equal to the lines ``diff`` prints, in text and JSON; its failures are ``diff``'s."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from diffstore.client import Client
from diffstore.engine.types import StoreConfig
from tests.helpers import running_server

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


@pytest.fixture
def short_pages(tmp_path: Path) -> Iterator[LiveServer]:
    """A server whose diff pages cover at most 2 generations: a longer range is answered in spans."""
    with running_server(tmp_path / "data", store_config=StoreConfig(max_diff_generations=2)) as live:
        yield live


def test_a_range_answered_in_spans_shows_each_key_once(
    capsys: pytest.CaptureFixture[str], short_pages: LiveServer
) -> None:
    """Over 5 generations (3 spans) a key inserted, then updated twice, is one insert of its last value; a
    key updated twice is one update from its value at --from; a key inserted and deleted again is not shown;
    the counts of --stat agree. (Printed per span, the keys came once per span that changed them.)"""
    with Client(short_pages.url) as client:
        c = client.create_collection("C", manual=True)
        steps: list[list[tuple[bytes, bytes | None]]] = [
            [(b"a", b"1"), (b"b", b"1")],  # g1
            [(b"c", b"1"), (b"a", b"2")],  # g2
            [(b"c", b"2"), (b"e", b"1")],  # g3
            [(b"c", b"3"), (b"a", b"3")],  # g4
            [(b"e", None), (b"d", b"1")],  # g5
        ]
        for n, items in enumerate(steps, start=1):
            generation = b"g%d" % n
            c.start_generation(generation)
            c.put_many(items, generation_id=generation)
            c.commit_generation(generation)
        spans = list(c.diff(from_generation_id=b"g1", to_generation_id=b"g5"))
        assert len(spans) > len({item.key for item in spans})  # the server did split the range
    code, out, _ = run(capsys, short_pages, "diff", "C", "--from", "g1", "--to", "g5")
    assert (code, out.splitlines()) == (0, ["~ a\t1\t3", "+ c\t3", "+ d\t1"])
    assert run(capsys, short_pages, "diff", "C", "--from", "g1", "--stat") == (
        0,
        "2 inserted, 1 updated, 0 deleted\n",
        "",
    )
    code, out, _ = run(capsys, short_pages, "diff", "C", "--from", "", "--format", "json")
    assert [json.loads(line) for line in out.splitlines()] == [
        {"key": "a", "fromValue": None, "toValue": "3"},
        {"key": "b", "fromValue": None, "toValue": "1"},
        {"key": "c", "fromValue": None, "toValue": "3"},
        {"key": "d", "fromValue": None, "toValue": "1"},
    ]
