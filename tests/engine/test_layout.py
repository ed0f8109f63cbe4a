"""Round trips and order of the storage layout (``diffstore.engine.layout``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from diffstore.engine import layout

keys = st.one_of(
    st.binary(max_size=8),
    st.binary(min_size=195, max_size=230).map(lambda b: b"P" * 190 + b),
    st.binary(max_size=300),
)
values = st.one_of(st.none(), st.binary(max_size=20))


@given(keys, keys)
def test_key_forms_keep_bytewise_order_outside_long_groups(a: bytes, b: bytes) -> None:
    fa, fb = layout.key_form(a), layout.key_form(b)
    same_group = (
        layout.is_long_form(fa) and layout.is_long_form(fb) and layout.long_group(fa) == layout.long_group(fb)
    )
    if a == b:
        assert fa == fb
    elif not same_group:
        assert (a < b) == (fa < fb)
    assert layout.is_long_form(fa) == (len(a) > layout.LONG_KEY_PREFIX)


@given(keys, values)
def test_values_and_keys_round_trip(key: bytes, value: bytes | None) -> None:
    raw = layout.encode_value(key, value)
    assert layout.decode_value(raw) == value
    assert layout.key_of(layout.key_form(key), raw) == key


@given(keys, st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1))
def test_record_and_change_keys_round_trip(key: bytes, seq: int, cid: int) -> None:
    form, prefix, records_prefix = layout.key_form(key), layout.cid_bytes(cid), layout.records_prefix(cid)
    record_key = layout.record_key(records_prefix, form, seq)
    assert layout.parse_record_key(record_key) == (cid, form, seq)
    head = layout.record_head(records_prefix, form)
    assert layout.record_head_of(record_key) == head and record_key == head + layout.record_seq(seq)
    assert layout.record_form(record_key) == form
    assert layout.read_record_seq(record_key[len(head) :]) == seq
    assert layout.split_change_key(layout.change_key(prefix, seq, form)) == (seq, form)
    assert len(record_key) <= 511  # LMDB's default maximum key size


@given(keys, keys, st.integers(0, 2**64 - 1), st.integers(0, 3), st.integers(0, 3))
def test_a_records_key_begins_with_a_head_only_when_it_is_a_version_of_its_key(
    a: bytes, b: bytes, seq: int, cid_a: int, cid_b: int
) -> None:
    # what the scans rely on instead of the layout's widths (layout.py, "records")
    head = layout.record_head(layout.records_prefix(cid_a), layout.key_form(a))
    key = layout.record_key(layout.records_prefix(cid_b), layout.key_form(b), seq)
    assert key.startswith(head) == (cid_a == cid_b and layout.key_form(a) == layout.key_form(b))


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_encoded_seqs_sort_as_the_seqs(a: int, b: int) -> None:
    assert (layout.record_seq(a) < layout.record_seq(b)) == (a < b)


@given(st.binary(min_size=1, max_size=12))
def test_next_prefix_bounds_every_extension(prefix: bytes) -> None:
    bound = layout.next_prefix(prefix)
    if bound is None:
        assert set(prefix) == {0xFF}
    else:
        assert prefix < bound and not bound.startswith(prefix)
        assert prefix + b"\xff" * 8 < bound


@pytest.mark.parametrize("cid", [1, 0x25, 0x2525, 0x25252525])  # 0x25 is "%": the bulk path formats keys
@pytest.mark.parametrize("seq", [1, 0x25, 0x2525252525])
def test_bulk_rows_equal_the_one_key_encoders(cid: int, seq: int) -> None:
    prefix, records_prefix = layout.cid_bytes(cid), layout.records_prefix(cid)
    for latest in (
        {b"a%b": b"1", b"\x00%\x00": None, b"": b"", b"%s%%": b"x"},  # a key with 00: every key escaped
        {b"a%b": b"1", b"%s": None, b"": b""},
        {b"a%b": b"1", b"": b"", b"z": b"%s"},  # no tombstone: values built as LMDB takes them
    ):
        record_keys, stored, change_keys = layout.short_rows(cid, seq, latest)
        forms = [layout.key_form(key) for key in latest]
        assert record_keys == [layout.record_key(records_prefix, form, seq) for form in forms]
        assert change_keys == [layout.change_key(prefix, seq, form) for form in forms]
        assert (
            list(stored())
            == list(stored())
            == [
                layout.seal(record_key, layout.encode_value(key, value))
                for record_key, (key, value) in zip(record_keys, latest.items(), strict=True)
            ]
        )
