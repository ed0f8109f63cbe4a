"""The pure parts: generation arithmetic, round planning and option parsing (no Spark, no server)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from diffstore.engine.history import validate_metadata
from diffstore.engine.types import LeaseToken
from diffstore.errors import InvalidRequest
from diffstore.spark._prefetch import ahead
from diffstore.spark.cli import _sources, add_commands, run_transform
from diffstore.spark.lookup import sorted_chunks
from diffstore.spark.options import SparkReadOptions, SparkWriteOptions, encode_split_keys
from diffstore.spark.plan import RoundPlan, next_round_number, plan_sources


def test_round_metadata_names_the_job_the_round_and_the_ranges_within_4_kib() -> None:
    ranges = plan_sources({"a": "A", "b": "B"}, {"a": None, "b": b"0001"}, {"a": b"\x00\x01", "b": b"0002"})
    assert ranges is not None
    assert RoundPlan(b"g", b"base", ranges).metadata("jobs:fn", 7) == {
        "job": "jobs:fn",
        "round": "7",
        "source.a": '""..base64:AAE=',
        "source.b": "0001..0002",
    }
    many = plan_sources(
        {f"source_{i:03}_{'x' * 40}": "A" for i in range(100)},
        {f"source_{i:03}_{'x' * 40}": None for i in range(100)},
        {f"source_{i:03}_{'x' * 40}": bytes(range(32)) for i in range(100)},
    )
    assert many is not None
    metadata = RoundPlan(b"g", b"base", many).metadata("j" * 10_000, 1)
    assert validate_metadata(metadata) == metadata  # the server takes it: at most 4 KiB
    kept = [k for k in metadata if k.startswith("source.")]
    assert 0 < len(kept) < 100 and metadata["sources.omitted"] == str(100 - len(kept))
    assert len(metadata["job"]) == 512
    assert (
        next_round_number(None) == next_round_number({"job": "x"}) == next_round_number({"round": "?"}) == 1
    )
    assert next_round_number({"round": "41"}) == 42


def test_plan_sources_and_reader_updates() -> None:
    sources = {"a": "A", "b": "B"}
    assert plan_sources(sources, {"a": None, "b": None}, {"a": b"", "b": b""}) is None
    assert plan_sources(sources, {"a": b"1", "b": b"2"}, {"a": b"1", "b": b"2"}) is None
    ranges = plan_sources(sources, {"a": None, "b": b"2"}, {"a": b"1", "b": b"2"})
    assert ranges is not None
    plan = RoundPlan(b"g", b"base", ranges)
    assert plan.reader_updates() == [
        {"readerName": "from_a", "generationId": b"1", "expectedGenerationId": None},
        {"readerName": "from_b", "generationId": b"2", "expectedGenerationId": b"2"},
    ]


def test_read_options() -> None:
    snapshot = SparkReadOptions.parse({"url": "http://x", "collection": "A", "generationid": "g1"})
    assert not snapshot.is_diff and snapshot.generation_id == b"g1" and snapshot.partitions == 4
    diff = SparkReadOptions.parse(
        {
            "url": "u",
            "collection": "A",
            "fromGenerationId": "",
            "toGenerationId": "AAE=",
            "generationIdEncoding": "base64",
        }
    )
    assert diff.is_diff and diff.from_generation_id == b"" and diff.to_generation_id == b"\x00\x01"
    assert SparkReadOptions.parse({"url": "u", "collection": "A", "fromReader": "r"}).is_diff
    for bad in (
        {"collection": "A"},
        {"url": "u", "collection": "A", "fromReader": "r", "fromGenerationId": "1"},
        {"url": "u", "collection": "A", "toGenerationId": "1"},
        {"url": "u", "collection": "A", "partitions": "0"},
        {"url": "u", "collection": "A", "generationId": "!", "generationIdEncoding": "base64"},
    ):
        with pytest.raises(InvalidRequest):
            SparkReadOptions.parse(bad)


def test_unknown_options_are_refused_with_the_valid_ones() -> None:
    base = {"url": "u", "collection": "A"}
    with pytest.raises(
        InvalidRequest, match=r"unknown diffstore read option 'fromreadr' \(did you mean 'fromReader'\?\)"
    ):
        SparkReadOptions.parse(base | {"fromreadr": "r"})
    with pytest.raises(InvalidRequest, match="valid options: .*batchRows.*updateReaders"):
        SparkWriteOptions.parse(base | {"generationId": "g", "bogus": "1"})
    # Spark's own options and any spelling case pass
    assert SparkReadOptions.parse(base | {"PATH": "x", "token": "t"}).connection.token == "t"


def test_split_keys_option() -> None:
    base = {"url": "u", "collection": "A"}
    assert SparkReadOptions.parse(base).split_keys is None
    cuts = [b"\x00", b"k1", b"k2\xff"]
    assert SparkReadOptions.parse(base | {"splitKeys": encode_split_keys(cuts)}).split_keys == tuple(cuts)
    assert SparkReadOptions.parse(base | {"splitkeys": "[]"}).split_keys == ()
    for bad in ("[1]", "nope", '["!!"]', encode_split_keys([b"b", b"a"]), encode_split_keys([b"a", b"a"])):
        with pytest.raises(InvalidRequest):
            SparkReadOptions.parse(base | {"splitKeys": bad})


def test_sorted_chunks_dedupe_and_refuse_unsorted_keys() -> None:
    import pyarrow as pa

    def batches(*columns: list[bytes | None]) -> Iterator[pa.RecordBatch]:
        for column in columns:
            yield pa.RecordBatch.from_arrays([pa.array(column, pa.binary())], names=["key"])

    def chunks(*columns: list[bytes | None], size: int = 2) -> list[list[bytes]]:
        return [chunk.to_pylist() for chunk in sorted_chunks(batches(*columns), size)]

    assert chunks([b"a", b"a", None, b"b"], [b"b", b"c", b"d"], []) == [[b"a", b"b"], [b"c", b"d"]]
    assert chunks([b"a", b"b", b"c"], [b"c", b"d"], [b"e"]) == [[b"a", b"b"], [b"c", b"d"], [b"e"]]
    assert chunks([b"a", b"b", b"c", b"d", b"e"], [b"f"], size=4) == [[b"a", b"b", b"c", b"d"], [b"e", b"f"]]
    assert chunks([b"\x00", b"\x00\x00", b"\xff"], size=10) == [[b"\x00", b"\x00\x00", b"\xff"]]
    assert chunks([]) == [] and chunks([None, None]) == []
    for unsorted in ([[b"b"], [b"a"]], [[b"a", b"c", b"b"]], [[b"b", b"b"], [None, b"a"]]):
        with pytest.raises(InvalidRequest):
            chunks(*unsorted, size=10)
    large = pa.RecordBatch.from_arrays([pa.array([b"x", b"y"], pa.large_binary())], names=["key"])
    assert [chunk.type for chunk in sorted_chunks(iter([large]), 10)] == [pa.binary()]


def test_write_options() -> None:
    parsed = SparkWriteOptions.parse(
        {
            "url": "u",
            "collection": "C",
            "generationId": "Zw==",
            "generationIdEncoding": "base64",
            "commit": "false",
            "updateReaders": '[{"readerName": "r", "generationId": "AA==", "expectedGenerationId": null}]',
        }
    )
    assert parsed.generation_id == b"g" and not parsed.commit
    assert parsed.update_readers == (
        {"readerName": "r", "generationId": b"\x00", "expectedGenerationId": None},
    )
    with pytest.raises(InvalidRequest):
        SparkWriteOptions.parse({"url": "u", "collection": "C"})


def test_write_options_carry_a_lease() -> None:
    base = {"url": "u", "collection": "C", "generationId": "g"}
    assert SparkWriteOptions.parse(base).lease is None
    parsed = SparkWriteOptions.parse(base | {"leasename": "transform", "leaseVersion": "7"})
    assert parsed.lease == LeaseToken("transform", 7)
    for bad in ({"leaseName": "t"}, {"leaseVersion": "1"}, {"leaseName": "t", "leaseVersion": "0"},
                {"leaseName": "t", "leaseVersion": "x"}, {"leaseName": "", "leaseVersion": "1"}):  # fmt: skip
        with pytest.raises(InvalidRequest, match="lease"):
            SparkWriteOptions.parse(base | bad)


def test_the_package_and_its_command_import_without_pyspark() -> None:
    code = (
        "import sys; sys.modules['pyspark'] = None\n"  # any 'import pyspark' now fails
        "import diffstore, diffstore.spark, diffstore.spark.plan, diffstore.spark.options\n"
        "import argparse, diffstore.spark.cli as cli\n"
        "cli.add_commands(argparse.ArgumentParser().add_subparsers())\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_transform_command_line() -> None:
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers())
    argv = ["transform", "--url", "http://h:1", "--job", "job:fn", "--target", "C", "--source", "a=A"]
    args = parser.parse_args([*argv, "--source", "b=B", "--watch"])
    assert args.func is run_transform and args.watch and args.target == "C"
    assert _sources(args.source) == {"a": "A", "b": "B"}
    with pytest.raises(SystemExit):
        _sources(["nope"])


def test_ahead_keeps_order_and_hands_over_errors() -> None:
    assert list(ahead(iter(range(50)), depth=2)) == list(range(50))

    def failing() -> Iterator[int]:
        yield 1
        raise InvalidRequest("late")

    got: list[int] = []
    with pytest.raises(InvalidRequest, match="late"):
        for item in ahead(failing()):
            got.append(item)
    assert got == [1]
    early = ahead(iter(range(1_000)), depth=1)
    assert next(early) == 0
    early.close()  # the producer stops instead of blocking forever
