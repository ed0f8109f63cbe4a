"""Type hints of the optional compiled accelerator (_accel.c); see layout.ACCEL."""

from collections.abc import Callable, Iterator
from typing import Any

SOURCE: str
"""sha256 of the _accel.c this was built from (setup.py passes it; layout.py compares)."""

class SortedRows:
    """The checked items of a sorted put; ``records()`` and ``changes()`` iterate their rows (each row
    tuple, and its bytes, may be filled anew once the consumer lets go of it)."""

    @property
    def first_record_key(self) -> bytes: ...
    @property
    def first_change_key(self) -> bytes: ...
    def __len__(self) -> int: ...
    def records(self) -> Iterator[tuple[bytes, bytes]]: ...
    def changes(self) -> Iterator[tuple[bytes, bytes]]: ...
    def chunks(self, limit: int) -> list[tuple[bytes, bytes]]: ...
    def digest(self) -> tuple[int, int]: ...

def sorted_short_rows(
    items: object, record_prefix: bytes, record_suffix: bytes, change_prefix: bytes, seal: bool = True
) -> SortedRows | None: ...
def unpack_forms(raw: bytes) -> list[bytes]: ...
def pack_columns(rows: list[Any], fields: int) -> tuple[tuple[bytes, bytes, bytes | None], ...]: ...
def query_scan(
    records: Iterator[tuple[bytes, bytes]],
    seq_limit: bytes,
    stop: bytes,
    from_key: bytes | None,
    to_key: bytes | None,
    after_key: bytes | None,
    count: int,
    record_type: type[tuple[object, ...]],
    known: dict[Any, bytes],
    names: Callable[[int], bytes],
) -> tuple[list[Any], bytes | None]: ...
def get_many_scan(
    records: Any,  # an lmdb.Cursor: its set_range, prev, last and item are called
    prefix: bytes,
    keys: list[bytes],
    above: bytes,
    record_type: type[tuple[object, ...]],
    known: dict[Any, bytes],
    names: Callable[[int], bytes],
    key_form: Callable[[bytes], bytes],
) -> list[Any] | None: ...

class MergeForms:
    def __init__(self, iterables: list[Iterator[bytes]]) -> None: ...
    def __iter__(self) -> MergeForms: ...
    def __next__(self) -> bytes: ...

class DiffScan:
    def __init__(
        self,
        records: Iterator[tuple[bytes, bytes]],
        from_seq: bytes,
        to_bound: bytes,
        stop: bytes,
        from_key: bytes | None,
        to_key: bytes | None,
        after_key: bytes | None,
        idle_limit: int,
        item_type: type[tuple[object, ...]],
        empty: tuple[()],
    ) -> None: ...
    def __iter__(self) -> DiffScan: ...
    def __next__(self) -> tuple[bytes, bytes | None, bytes | None, tuple[()]]: ...
    @property
    def handed(self) -> bytes | None: ...

class KeyedScan:
    def __init__(
        self,
        records: Any,  # an lmdb.Cursor: its set_range, next and item are called
        prefix: bytes,
        forms: Iterator[bytes],
        from_seq: bytes,
        to_bound: bytes,
        from_key: bytes | None,
        to_key: bytes | None,
        after_key: bytes | None,
        stretch: int,
        item_type: type[tuple[object, ...]],
        empty: tuple[()],
    ) -> None: ...
    def __iter__(self) -> KeyedScan: ...
    def __next__(self) -> tuple[bytes, bytes | None, bytes | None, tuple[()]]: ...
    @property
    def long_form(self) -> bytes | None: ...
    @property
    def resume(self) -> bytes | None: ...
    @property
    def left(self) -> int | None: ...

def digest_pairs(pairs: list[tuple[bytes, bytes]]) -> tuple[int, int]: ...
def digest_rows(records: Any, prefix: bytes, encoded: bytes) -> tuple[int, int]: ...
def digest_changes(
    cursor: Any, prefix: bytes, forms: Iterator[bytes], encoded: bytes, replaces: bool
) -> tuple[tuple[int, int], tuple[int, int]]: ...
def check_records(
    rows: Iterator[tuple[bytes, bytes]],
    targets: list[tuple[int, int, int, bytes, bytearray]],
    dropped: set[int],
    sealed: bool,
    tick: Callable[[int], None],
    every: int,
) -> tuple[int, list[tuple[bytes, bytes]], int]: ...
def check_runs(
    rows: Iterator[tuple[bytes, bytes]],
    chunked: bool,
    targets: list[tuple[int, int, int, bytes, bytearray]],
    dropped: set[int],
    tick: Callable[[int], None],
    every: int,
) -> tuple[int, list[tuple[bytes, bytes, tuple[bytes, bytes] | None]]]: ...
