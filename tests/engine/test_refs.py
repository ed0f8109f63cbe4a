"""The ref grammar (``diffstore.engine.refs.parse``), pure: each form's typed value, each bad text refused;
and time and ~N refs resolved against a store's own clock."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from diffstore import ResolvedRef
from diffstore.engine import refs
from diffstore.errors import InvalidEncoding, InvalidRequest, NoSuchGeneration, text_form
from tests.engine.conftest import StoreFactory


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


def test_time_refs_against_a_clock(open_store: StoreFactory) -> None:
    """``@TIME`` on the store's clock: at or before a commit, before the first one, and the future (the
    current generation, as ``asOfMs`` reads it: one rule for both)."""
    now = [1_000_000]
    c = open_store(clock_ms=lambda: now[0]).create_collection("A", manual=True)
    for g, at in ((b"g1", 1_000_000), (b"g2", 2_000_000)):
        now[0] = at
        c.start_generation(g)
        c.commit_generation(g)
    now[0] = 3_000_000

    def at(ms: int) -> str:
        return "@" + datetime.fromtimestamp(ms // 1000, UTC).isoformat()

    assert c.resolve_ref(at(1_000_000)) == ResolvedRef(b"g1", 1_000_000)
    assert c.resolve_ref(at(1_999_000)) == ResolvedRef(b"g1", 1_000_000)
    assert c.resolve_ref(at(2_000_000)) == ResolvedRef(b"g2", 2_000_000)
    assert c.resolve_ref(at(3_000_000)) == ResolvedRef(b"g2", 2_000_000)  # now: not the future
    with pytest.raises(NoSuchGeneration):
        c.resolve_ref(at(999_000))
    assert c.resolve_ref(at(3_001_000)) == ResolvedRef(b"g2", 2_000_000)
    assert c.resolve_ref("@9999-12-31T23:59:59Z") == ResolvedRef(b"g2", 2_000_000)
    assert c.generation_at(10**15) == c.generation_at(2**63 - 1) == b"g2"
    assert c.resolve_ref("~1") == ResolvedRef(b"g1", 1_000_000)
    assert c.resolve_ref("~2") == ResolvedRef(b"", None)  # the initial generation, never committed
    with pytest.raises(NoSuchGeneration):
        c.resolve_ref("~3")
