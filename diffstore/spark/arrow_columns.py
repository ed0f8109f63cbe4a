"""Columns of a page (:class:`~diffstore.wire_columns.BinaryColumn`) as Arrow arrays, without a copy.

The columns form's buffers are Arrow's ``large_binary`` layout; the presence bytes become a validity
bitmap. Spark's schemas use ``binary`` (32-bit offsets), so the array is cast once, a loop over the
offsets in C.
"""

from __future__ import annotations

import sys

import pyarrow as pa
import pyarrow.compute as pc

from diffstore.errors import InvalidRequest
from diffstore.wire_columns import BinaryColumn


def binary_array(column: BinaryColumn) -> pa.Array:
    """``column`` as a ``binary`` array (absent rows are nulls).

    Raises:
        InvalidRequest: the offsets do not describe the data (a malformed answer).
    """
    validity = None
    if column.present is not None:
        flags = pa.Array.from_buffers(pa.uint8(), column.size, [None, pa.py_buffer(column.present)])
        validity = pc.not_equal(flags, 0).buffers()[1]
    offsets = column.offsets if sys.byteorder == "little" else column.offset_values().tobytes()
    first, last = offsets[:8], offsets[-8:]
    if int.from_bytes(first, sys.byteorder) != 0 or int.from_bytes(last, sys.byteorder) != len(column.data):
        raise InvalidRequest("a column's offsets do not describe its data: they run from 0 to its length")
    array = pa.Array.from_buffers(
        pa.large_binary(), column.size, [validity, pa.py_buffer(offsets), pa.py_buffer(column.data)]
    )
    try:
        array.validate(full=True)
    except pa.ArrowInvalid as exc:
        raise InvalidRequest(f"a column's offsets do not describe its data: {exc}") from exc
    return array.cast(pa.binary())


def binary_batch(schema: pa.Schema, *columns: BinaryColumn) -> pa.RecordBatch:
    """A record batch of ``columns`` (one page's fields, in ``schema``'s order) as binary arrays."""
    return pa.RecordBatch.from_arrays([binary_array(column) for column in columns], schema=schema)
