"""The ref grammar (``diffstore.engine.refs.parse``), pure: each form's typed value, each bad text refused."""

from __future__ import annotations

import pytest

from diffstore.engine import refs
from diffstore.errors import InvalidEncoding, InvalidRequest, text_form


@pytest.mark.parametrize(
    ("text", "ref"),
    [
        ("g1", refs.Literal(b"g1")),
        ("", refs.Literal(b"")),
        ("base64:AAE=", refs.Literal(b"\x00\x01")),
        ("@current", refs.Current()),
        ("@open", refs.Open()),
        ("~0", refs.Back(0)),
        ("~12", refs.Back(12)),
        ("@reader:r", refs.ReaderPosition("r")),
        ("@reader:C/r", refs.ReaderPosition("r", "C")),
        ("@reader:C/hstream/sub/0", refs.ReaderPosition("hstream/sub/0", "C")),
        ("@2026-11-25T10:00:00Z", refs.AsOf(1_795_600_800_000)),
        ("@2026-11-25T11:00:00+01:00", refs.AsOf(1_795_600_800_000)),
        ("@2026-11-25T10:00:00.250Z", refs.AsOf(1_795_600_800_250)),
    ],
)
def test_each_form(text: str, ref: refs.Ref) -> None:
    assert refs.parse(text) == ref


@pytest.mark.parametrize(
    "text",
    ["@", "@now", "@Current", "~", "~-1", "~1.5", "~ 1", "@reader:", "@reader:C/", "@reader:/r",
     "@2026-11-25T10:00:00", "@2026-11-25", "@yesterday", "x" * 1025],
)  # fmt: skip
def test_bad_forms_are_invalid_requests(text: str) -> None:
    with pytest.raises(InvalidRequest):
        refs.parse(text)


def test_bad_base64_is_an_invalid_encoding() -> None:
    with pytest.raises(InvalidEncoding):
        refs.parse("base64:!!")


@pytest.mark.parametrize("data", [b"@current", b"~1", b"@x", b"~"])
def test_ids_that_read_as_refs_are_printed_in_base64(data: bytes) -> None:
    """The text form never prints an id as a ref: printed and given back, it names the same id."""
    shown = text_form(data)
    assert shown.startswith("base64:") and refs.parse(shown) == refs.Literal(data)
