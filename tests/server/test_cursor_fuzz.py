"""Fuzzing cursor tokens over HTTP: random edits of real tokens, forgeries signed with a wrong key, and
tokens with random fields signed with the right one. Never a 5xx, never a page above its limit.

``TRIED`` counts the inputs per class (``pytest -s`` prints them).
"""

from __future__ import annotations

import base64
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diffstore.engine.cursors import CursorCodec, CursorSecret
from tests.engine.util import raw_state

from .conftest import Live, es, live_server

LIMIT = 5
FUZZ = settings(
    max_examples=300,
    derandomize=True,  # the same inputs on every run: CI must not be flaky
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
TRIED: Counter[str] = Counter()


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Live, dict[str, str]]]:
    """A live server with manual ``m`` (two generations of 20 keys) and a real query and diff token."""
    with live_server(tmp_path_factory.mktemp("fuzz") / "data") as live:
        live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
        for gen in ("1", "2"):
            live.ok("POST", "/collections/m/generation/start", {"generationId": es(gen)})
            items = [{"key": es(f"k{i:02}"), "value": es(f"{gen}-{i}")} for i in range(20)]
            live.ok("POST", "/collections/m/putMany", {"items": items, "generationId": es(gen)})
            live.ok("POST", "/collections/m/generation/commit", {"generationId": es(gen)})
        tokens = {
            "query": live.ok("POST", "/collections/m/query/", {"limit": LIMIT})["cursorId"],
            "diff": live.ok("POST", "/collections/m/diff/", {"fromGenerationId": es("1"), "limit": LIMIT})[
                "cursorId"
            ],
        }
        yield live, tokens


def _raw(token: str) -> bytes:
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))


def _text(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _follow(live: Live, kind: str, token: str) -> int:
    """GETs the page; asserts no 5xx, the SPEC §2 body of an error, and a page within the limit."""
    response = live.call("GET", f"/collections/m/{kind}/{token}")
    assert response.status_code < 500, response.text
    body = response.json()
    if response.status_code == 200:
        assert len(body["items"]) <= LIMIT
    else:
        assert (response.status_code, body["error"]) in {(404, "noSuchCursor"), (410, "cursorExpired")}, body
    return response.status_code


def _edits() -> st.SearchStrategy[list[tuple[str, int, int]]]:
    op = st.tuples(
        st.sampled_from(["flip", "set", "insert", "delete", "cut"]), st.integers(0, 400), st.integers(0, 255)
    )
    return st.lists(op, min_size=1, max_size=4)


@FUZZ
@given(kind=st.sampled_from(["query", "diff"]), edits=_edits())
def test_edited_tokens(
    fuzzed: tuple[Live, dict[str, str]], kind: str, edits: list[tuple[str, int, int]]
) -> None:
    live, tokens = fuzzed
    raw = bytearray(_raw(tokens[kind]))
    for op, at, value in edits:
        at %= max(len(raw), 1)
        if op == "flip" and raw:
            raw[at] ^= 1 << (value % 8)
        elif op == "set" and raw:
            raw[at] = value
        elif op == "insert":
            raw.insert(at, value)
        elif op == "delete" and raw:
            del raw[at]
        elif op == "cut":
            del raw[at:]
    TRIED["edited"] += 1
    status = _follow(live, kind, _text(bytes(raw)) or "A")
    assert status == 200 or bytes(raw) != _raw(tokens[kind])


@FUZZ
@given(
    kind=st.sampled_from(["query", "diff"]), text=st.text(alphabet=st.characters(codec="ascii"), max_size=200)
)
def test_arbitrary_token_text(fuzzed: tuple[Live, dict[str, str]], kind: str, text: str) -> None:
    live, tokens = fuzzed
    cut = tokens[kind][: len(tokens[kind]) // 2]
    TRIED["text"] += 1
    for token in (text, cut + text):
        token = "".join(c for c in token if c.isalnum() or c in "-_") or "x"
        assert _follow(live, kind, token) == 404


_FIELD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.binary(max_size=300),
    st.text(max_size=20),
    st.lists(st.integers(0, 3), max_size=2),
    st.floats(allow_nan=False),
)


def _sign(codec: CursorCodec, fields: list[Any]) -> str:
    body = msgpack.packb(fields, use_bin_type=True)
    return _text(codec._mac(body) + body)


@FUZZ
@given(
    kind=st.sampled_from(["query", "diff"]), changes=st.dictionaries(st.integers(0, 11), _FIELD, min_size=1)
)
def test_forged_fields(
    fuzzed: tuple[Live, dict[str, str]],
    tmp_path_factory: pytest.TempPathFactory,
    kind: str,
    changes: dict[int, Any],
) -> None:
    """Fields changed at will, signed with a wrong key (a forger) and with the right one (a token of
    another format, or a server bug): the first is always refused, the second never passes a check."""
    live, tokens = fuzzed
    fields = msgpack.unpackb(_raw(tokens[kind])[16:], raw=False)
    for index, value in changes.items():
        if index < len(fields):
            fields[index] = value
        else:
            fields.append(value)
    wrong = CursorCodec(CursorSecret(_wrong_key_dir(tmp_path_factory)))
    before = raw_state(live.store)
    TRIED["forged"] += 1
    assert _follow(live, kind, _sign(wrong, fields)) == 404
    status = _follow(live, kind, _sign(live.store.cursors, fields))
    assert raw_state(live.store) == before
    if status == 200:  # only fields that pass every check: a real page of at most the limit
        assert fields[0] == 2 and 1 <= fields[8 if kind == "query" else 10] <= 10_000


# every integer field of each token (index in [version, kind, *fields]): cid and seqs, and the limit
_INT_FIELDS = {"query": (2, 4, 8), "diff": (2, 4, 6, 10)}
_EDGES = (-(2**63), -2, -1, 0, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1)


@pytest.mark.parametrize("kind", ["query", "diff"])
def test_every_integer_field_at_its_edges_is_refused_or_served_never_a_500(
    fuzzed: tuple[Live, dict[str, str]], kind: str
) -> None:
    """A token re-signed with the server's key and an integer field at the edge of its type (a diff whose
    ``to_seq`` is 2**64 - 1 used to overflow the read's upper bound: a 500 and a reset connection)."""
    live, tokens = fuzzed
    fields = msgpack.unpackb(_raw(tokens[kind])[16:], raw=False)
    before = raw_state(live.store)
    for index in _INT_FIELDS[kind]:
        for edge in _EDGES:
            changed = [*fields[:index], edge, *fields[index + 1 :]]
            _follow(live, kind, _sign(live.store.cursors, changed))
    assert raw_state(live.store) == before
    assert _follow(live, kind, tokens[kind]) == 200  # and the server still serves


def _wrong_key_dir(factory: pytest.TempPathFactory) -> Path:
    path = factory.getbasetemp() / "wrong-key"
    path.mkdir(exist_ok=True)
    return path


def test_every_class_ran() -> None:
    """Runs after the fuzz tests (file order); prints how many inputs each class tried."""
    if not TRIED:
        pytest.skip("the fuzz tests did not run in this session")
    print(f"\ncursor fuzz inputs by class: {dict(TRIED)}")
    assert all(TRIED[name] >= 100 for name in ("edited", "text", "forged")), TRIED
