"""Columns of a page as Arrow arrays: the same rows as the column's list, and malformed offsets refused."""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from diffstore.errors import InvalidRequest
from diffstore.spark.arrow_columns import binary_array
from diffstore.wire_columns import BinaryColumn


@given(st.lists(st.none() | st.binary(max_size=12), max_size=60))
def test_an_arrow_array_holds_the_rows_of_its_column(rows: list[bytes | None]) -> None:
    array = binary_array(BinaryColumn.of(rows))
    assert array.type == pa.binary() and array.to_pylist() == rows
    assert array.null_count == rows.count(None)


@pytest.mark.parametrize("offsets", [(1, 1, 2), (0, 2, 1), (0, 1, 3), (0, 1, 1)])
def test_offsets_that_do_not_describe_the_data_are_refused(offsets: tuple[int, ...]) -> None:
    column = BinaryColumn(2, struct.pack("<3q", *offsets), b"ab")
    with pytest.raises(InvalidRequest, match="offsets"):
        binary_array(column)
