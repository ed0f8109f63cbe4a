"""Transform previews end to end: a real local SparkSession, a real uvicorn server, a real LMDB store.

The claim under test: a preview holds exactly what the round that follows the same changes, made for
real, then commits — and until then nothing moves.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers_spark import commit_items, initial_load, load_example_job, random_changes, snapshot

from diffstore import Store, shell
from diffstore.client import Client
from diffstore.errors import InvalidEncoding, InvalidRequest
from diffstore.spark import PreviewTooLarge, Transform
from diffstore.wire import decode_es

USERS = 200
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark_a_plus_b"

Items = list[tuple[bytes, bytes | None]]


def _transform(spark: Any, url: str, names: dict[str, str]) -> Transform:
    sources = {"a": names["A"], "b": names["B"]}
    return Transform(spark, url, names["C"], sources, load_example_job().country_totals, partitions=2)


def _expected(store: Store, names: dict[str, str]) -> dict[bytes, bytes]:
    return load_example_job().recompute(snapshot(store, names["A"]), snapshot(store, names["B"]))


def _phantom(url: str, name: str, items: Items) -> dict[str, str]:
    """A phantom of ``name`` over its current generation holding ``items``, started over plain HTTP:
    its id is the ``phantomId`` map ``phantom/start`` answers."""
    started = httpx.post(f"{url}/collections/{name}/phantom/start", json={})
    assert started.status_code == 200, started.text
    phantom_id = started.json()["phantomId"]
    with Client(url) as client:
        collection = client.collection(name)
        collection.put_many(items, generation_id=collection.generation_id, phantom_id=decode_es(phantom_id))
    return phantom_id  # type: ignore[no-any-return]


def _moving_parts(store: Store, names: dict[str, str]) -> Any:
    """Everything a preview must leave alone: generations and readers of A, B, C, and C's records."""
    return (
        {name: store.collection(name).generation_state() for name in names.values()},
        {name: store.collection(name).readers() for name in names.values()},
        snapshot(store, names["C"]),
    )


def _view(url: str, name: str, phantom: dict[str, str]) -> dict[bytes, bytes]:
    """``name`` as a ``query`` carrying the preview's phantom id sees it."""
    with Client(url, format="json") as client:
        return {r.key: r.value for r in client.collection(name).query(phantom_id=decode_es(phantom))}


def test_a_preview_is_what_the_round_after_the_same_changes_commits(spark, server_url, store, names) -> None:
    rng = random.Random(18)
    for name in names.values():
        store.create_collection(name, manual=True)
    a, b = initial_load(rng, USERS)
    commit_items(store, names["A"], a)
    commit_items(store, names["B"], b)
    transform = _transform(spark, server_url, names)
    try:
        assert len(transform.run()) == 1
        # A moves on after the last round: the reader from_a is behind A's current generation, so the
        # preview must include those committed changes as well as the phantom's
        behind, _ = random_changes(rng, USERS, 30)
        commit_items(store, names["A"], behind)
        a_changes, b_changes = random_changes(rng, USERS, 40)
        phantom_a = _phantom(server_url, names["A"], a_changes)
        phantom_b = decode_es(_phantom(server_url, names["B"], b_changes))  # bytes are taken too
        before = _moving_parts(store, names)
        preview = transform.preview({"a": phantom_a, "b": phantom_b})
        assert set(preview) <= {"value", "encoding"}  # the form phantom/start answers
        assert _moving_parts(store, names) == before  # nothing committed, no reader moved
        previewed = _view(server_url, names["C"], preview)
        assert previewed != before[2]  # the changes do change C (else the comparison below proves little)

        commit_items(store, names["A"], a_changes)
        commit_items(store, names["B"], b_changes)
        assert len(transform.run()) == 1
        assert snapshot(store, names["C"]) == previewed == _expected(store, names)
    finally:
        transform.close()


def test_a_preview_of_a_new_target_creates_no_reader(spark, server_url, store, names) -> None:
    rng = random.Random(7)
    for name in names.values():
        store.create_collection(name, manual=True)
    a, b = initial_load(rng, USERS)
    commit_items(store, names["A"], a)
    commit_items(store, names["B"], b)
    a_changes, _ = random_changes(rng, USERS, 25)
    phantom = _phantom(server_url, names["A"], a_changes)
    transform = _transform(spark, server_url, names)
    try:
        before = _moving_parts(store, names)
        preview = transform.preview({"a": phantom}, ttl_seconds=600)
        assert _moving_parts(store, names) == before
        assert store.collection(names["C"]).readers() == []  # a round would create them; a preview does not
        previewed = _view(server_url, names["C"], preview)
        commit_items(store, names["A"], a_changes)
        transform.run()
        assert snapshot(store, names["C"]) == previewed == _expected(store, names)
    finally:
        transform.close()


def test_bad_previews_are_refused_and_change_nothing(spark, server_url, store, names) -> None:
    rng = random.Random(3)
    for name in names.values():
        store.create_collection(name, manual=True)
    a, b = initial_load(rng, USERS)
    commit_items(store, names["A"], a)
    commit_items(store, names["B"], b)
    phantom_a = _phantom(server_url, names["A"], [(b"u\xff\x00\x00\x00\x01", b"FR")])
    phantom_b = _phantom(server_url, names["B"], [(b"u\xff\x00\x00\x00\x01", b"5")])
    target = store.collection(names["C"])
    first_phantom = target.start_phantom()
    transform = _transform(spark, server_url, names)
    before = _moving_parts(store, names)
    try:
        cases: list[tuple[dict[str, Any], type[Exception], str]] = [
            ({"z": phantom_a}, InvalidRequest, "unknown source 'z'; the sources are 'a', 'b'"),
            ({"a": {"value": "*", "encoding": "base64"}}, InvalidEncoding, "invalid base64"),
            ({"a": b"short"}, InvalidRequest, "not a phantom id"),
            ({"a": b"\x00\x00\x00\x00\x00\x00\x00\x63"}, InvalidRequest, "not a live phantom"),
            ({"a": phantom_b}, InvalidRequest, "source 'a'.*another collection"),
            ({"a": 42}, InvalidRequest, "expected the EncodedString map"),
        ]
        for phantoms, error, message in cases:
            with pytest.raises(error, match=message):
                # a bad id is named before any diff is read (these diffs hold 200 changes each)
                transform.preview(phantoms, max_rows=10)
        # the first round reads every record of A and B: far more than a driver-side preview takes here
        with pytest.raises(PreviewTooLarge, match="more than 10 changes"):
            transform.preview({"a": phantom_a}, max_rows=10)
        with pytest.raises(InvalidRequest, match="ttl_seconds"):
            transform.preview({"a": phantom_a}, ttl_seconds=0)
    finally:
        transform.close()
    assert _moving_parts(store, names) == before
    # no phantom of the target was started by the refused previews: the next one follows the first
    next_phantom = target.start_phantom()
    assert int.from_bytes(next_phantom, "big") == int.from_bytes(first_phantom, "big") + 1


def test_the_command_prints_the_preview_phantom_and_its_changes(spark, server_url, store, names) -> None:
    """``diffstore transform --preview`` in its own process (its own Spark), text and JSON."""
    rng = random.Random(11)
    for name in names.values():
        store.create_collection(name, manual=True)
    a, b = initial_load(rng, USERS)
    commit_items(store, names["A"], a)
    commit_items(store, names["B"], b)
    phantom = decode_es(_phantom(server_url, names["A"], [(b"u\xff\x00\x00\x00\x01", None)]))
    before = _moving_parts(store, names)
    argv = [
        sys.executable, "-m", "diffstore", "transform", "--url", server_url, "--job", "job:country_totals",
        "--target", names["C"], "--source", f"a={names['A']}", "--source", f"b={names['B']}",
        "--preview", f"a={shell.show(phantom)}", "--format", "json",
    ]  # fmt: skip
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(argv, cwd=EXAMPLE, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert _moving_parts(store, names) == before
    preview = shell.parse(printed["phantomId"])
    assert decode_es(printed["phantomIdEncodedString"]) == preview
    with Client(server_url) as client:
        view = {r.key: r.value for r in client.collection(names["C"]).query(phantom_id=preview)}
    # C was empty: every country is a put, the deleted user's contribution is simply absent
    countries = dict(snapshot(store, names["A"]))
    countries.pop(b"u\xff\x00\x00\x00\x01")
    expected = load_example_job().recompute(countries, snapshot(store, names["B"]))
    assert view == expected
    assert printed["puts"] == len(expected) and printed["deletes"] == 0
    assert printed["more"] == max(0, len(expected) - 10)
    assert [shell.parse(row["key"]) for row in printed["changes"]] == sorted(expected)[:10]

    text = subprocess.run(
        [*argv[:-2], "--format", "text"], cwd=EXAMPLE, env=env, capture_output=True, text=True, timeout=300
    )
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith("phantom base64:")
    assert f"{len(expected)} put{'' if len(expected) == 1 else 's'}, 0 deletes" in lines[1]
    assert all(line.startswith("+ ") for line in lines[2 : 2 + min(10, len(expected))])
    # the id as printed is what 'diffstore query --phantom' takes back
    query = subprocess.run(
        [sys.executable, "-m", "diffstore", "query", names["C"], "--url", server_url, "--phantom",
         lines[0].split(" ", 1)[1], "--format", "json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert query.returncode == 0, query.stderr
    rows = [json.loads(line) for line in query.stdout.splitlines()]
    assert {shell.parse(r["key"]): shell.parse(r["value"]) for r in rows} == expected
