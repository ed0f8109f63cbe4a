"""``--preview ALIAS=PHANTOM`` parsing (no Spark): both id forms, and one clear error per mistake."""

from __future__ import annotations

import argparse

import orjson
import pytest

from diffstore.errors import InvalidEncoding, InvalidRequest
from diffstore.spark.cli import _previews, add_commands, run_transform
from diffstore.wire import encode_es

PHANTOM = b"\x00\x00\x00\x03\x00\x00\x00\x01"


def test_both_id_forms_are_taken() -> None:
    pasted = orjson.dumps(encode_es(PHANTOM)).decode()  # what phantom/start answers, as it is
    assert _previews(["a=base64:AAAAAwAAAAE=", f"b={pasted}"]) == {"a": PHANTOM, "b": PHANTOM}
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers())
    args = parser.parse_args(
        [
            "transform",
            "--job",
            "j:f",
            "--target",
            "C",
            "--source",
            "a=A",
            "--preview",
            "a=x",
            "--format",
            "json",
        ]
    )
    assert args.func is run_transform and args.preview == ["a=x"] and args.preview_ttl == 3600


@pytest.mark.parametrize(
    ("specs", "error", "message"),
    [
        (["a"], InvalidRequest, "wants ALIAS=PHANTOM"),
        (["=x"], InvalidRequest, "wants ALIAS=PHANTOM"),
        (["a=x", "a=y"], InvalidRequest, "names source 'a' twice"),
        (["a={nope"], InvalidRequest, "not valid JSON"),
        (["a=base64:***"], InvalidEncoding, "not valid base64"),
        (['a={"value": "*", "encoding": "base64"}'], InvalidEncoding, "invalid base64"),
    ],
)
def test_mistakes_are_one_clear_error(specs: list[str], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        _previews(specs)


def test_a_preview_does_not_create_the_target() -> None:
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers())
    argv = ["transform", "--url", "http://127.0.0.1:9", "--job", "j:f", "--target", "C", "--source", "a=A"]
    args = parser.parse_args([*argv, "--preview", "a=base64:AAAAAwAAAAE=", "--create-target"])
    with pytest.raises(InvalidRequest, match="does not create the target"):
        run_transform(args)  # refused before anything is imported, dialled or created
