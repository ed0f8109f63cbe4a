"""The storage layout: every raw LMDB key and stored value of the engine is built and parsed here.

One LMDB environment holds every collection. Each collection gets a 4-byte id (``cid``, never reused)
when it is created; every per-collection table starts its keys with it (``records`` with a shorter
form of it, below), so one write transaction can touch records, index, metadata and readers
atomically, and a deleted collection's rows are simply unreachable until the background purge removes
them.

Generations are *interned*: each generation that ever held records gets a ``seq`` (u64, increasing in
the same order as the generation ids, because a new next generation is always greater than every
generation before it). Records then carry a few bytes of seq instead of up to 255 bytes of id.

``records`` holds a row per version of every key, so its keys are kept short (a generation of keys
spread over a big collection dirties about a branch page per key, and shorter keys make fewer of them)::

    rcid  = n | cid in n bytes                  (n = 1..4, as few as the cid needs)
    rseq  = m | seq in m bytes | m              (m = 1..8; the last byte tells where the head ends)

Both sort as the numbers do and are prefix-free. Stores written with ``cid(u32) | K | seq(u64)`` record
keys (layout version 1) are upgraded when opened (``migrate.py``); ``collections`` row ``LAYOUT_ROW``
says the version.

User keys become a *key form* ``K`` that sorts like the key and fits in an LMDB key::

    short key (len <= 200):  esc(key) 00 00             esc: 00 -> 00 FF  (order preserving)
    long key  (len >  200):  esc(key[:200]) 00 01 H16   H16: 16 bytes of blake2b(key)

Long keys that share their first 200 bytes form a *group* that is contiguous in K order but ordered
by hash inside; readers restore the true order of a group in memory (rare by construction). The full
long key is kept in the record value.

Reader names and targets may be longer than LMDB keys allow, so the reverse index ``targets`` keys them
by 16-byte blake2b digests (H16) and keeps the reader's name in the value.

Named tables (sub-databases)::

    collections  name(utf-8)                         -> msgpack meta (see CollectionMeta); its 14th field,
                                                        the retention policy [keepMs|None, keepGenerations
                                                        |None] or None, is absent from older rows: none
    gens         cid | seq(u64)                      -> generation id
    gen_ids      cid | generation id                 -> seq(u64)
    commits      cid | seq(u64)                      -> msgpack [committed at ms, changed keys, metadata|None]
                                                        written by the commit of generation seq (a store
                                                        older than this row has none: time unknown)
    digests      cid | seq(u64)                      -> live records(u64) | digest(16 bytes)  the state at
                                                        committed generation seq (digests.py; a store
                                                        older than this row has none: digest unknown)
                 cid                                 -> seq(u64)  the first generation with a digest: every
                                                        committed one from there on has its row
                 cid | 00                            -> open seq(u64) | writes(u64) | records(u64) |
                                                        sum(16 bytes)  the open generation's digest delta
                                                        while each of its writes appended (digests.py)
    records      rcid | K | rseq                     -> record value (below)
    changes      cid | seq(u64) | K                  -> b""        keys written in a generation, one row each
    change_chunks cid | seq(u64) | K1                -> (len(u16) K)...  keys written in a generation, packed
    phantoms     cid | phantom(u64) | K              -> msgpack [[generation id, record value], ...]
    phantom_ttl  cid | phantom(u64)                  -> expiry, unix ms (u64)
    readers      cid | reader name(utf-8)            -> msgpack [target name, generation id | None]
    targets      H16(target) | cid | H16(name)        -> msgpack [reader name, generation id | None]
    producers    cid | producer id(utf-8)            -> committed seqNo, pending seqNo, its seq (3 x u64)
    leases       cid | lease name(utf-8)             -> msgpack [owner | None, version, expiresAtMs, ttlMs]
    dropped      cid                                 -> b""        deleted collections awaiting purge
    due          "a" | name(utf-8)                   -> unix ms(u64)  due time of the automatic commit
                 "g" | cid                           -> seq(u64) | K  where GC of a long generation resumes
    lineage      cid | seq(u64) | reader name(utf-8) -> msgpack [target, target cid | None, from, to]
                                                        a reader moved by the commit of generation seq
                                                        (from/to: generation ids or None; see lineage.py)
    replica      "primary"                           -> URL(utf-8)  this store follows that server
                 "id"                                -> this replica's id(utf-8), names its readers there
                 "promoted"                          -> unix ms(u64)  promoted: a primary since then
                 "applied"                           -> u64  primary generations applied, ever
                 "lag" | name(utf-8)                 -> msgpack [lag generations, unapplied since ms | None]
                 "term"                              -> u64  the replication term (any store; absent: 0)
                 "self"                              -> URL(utf-8)  the promoted store's address (as reached)
                 "fenced"                            -> msgpack [term, primary URL | None, replica id | None,
                                                        unix ms]  stepped down: writes refused (409 fenced)

Which keys a generation wrote (its *run*) is the union of its ``changes`` rows and its ``change_chunks``
rows. A chunk holds sorted key forms (at most ``CHUNK_BYTES`` of them, K1 its first), and the chunks of a
generation never overlap: a write whose sorted forms all lie above every form the generation holds yet (a
bulk load, a new generation's first batch) appends chunks -- one B-tree insert per ~75 keys of 16 bytes
instead of one per key -- and any other write adds a ``changes`` row per key the generation does not hold
yet.
Stores written before ``change_chunks`` existed hold ``changes`` rows only and are read as they are
(engine/changes.py reads both forms; a key is in at most one of them). Reading a chunk::

    run = cid | seq                       rows of the run: set_range(run | K) and the row before it
    value = 00 12 "key-000000000001" 00 00   00 12 "key-000000000002" 00 00  ...

Background work lives in ``due`` rather than in a process's memory, so that any process that opens the
directory can do it, and each item is taken (read, done, deleted) inside one write transaction: done once.

A lease row is never deleted while its collection lives (release sets owner None and expiry 0): its
version must keep growing, or a fencing token of an older holder could match a newer holder's version.
Deleting the collection makes its rows unreachable (a new collection of that name gets a new cid) and the
purge of the dropped cid removes them.

Record values, in their *plain* form::

    b""                          tombstone of a short key
    01 value                     value of a short key (so that b"" stays a legal value)
    02 len(u24) key              tombstone of a long key
    03 len(u24) key value        value of a long key

are stored *sealed*: the tag with bit 0x10 set, then a CRC-32 (zlib's; big-endian) of the records key
followed by the plain value, then the rest of the plain value::

    10 crc(u32)                  sealed tombstone of a short key (plain: b"")
    1t crc(u32) rest             sealed ``0t rest`` (t = 1, 2, 3)

so the checksum covers the key (collection, K and seq) and the value, is written in the same ``put`` as
the row, and a stored value says itself whether it carries one: a first byte below 0x10 (or none) is a
row written before checksums existed (session 26), read as it is; ``migrate.seal_records`` (run by
``diffstore migrate`` and ``compact``) seals them. ``collections`` row ``SEALED_ROW`` says every record of
the store is sealed (a new store, or one that was migrated), so that ``check`` reports a plain row there as
damage rather than as one that predates checksums. Readers call :func:`unseal` (verifies: a mismatch is
:class:`~diffstore.errors.CorruptRecord` naming the key) or :func:`plain` (strips only); digests hash the
plain form, so a sealed and a plain row of the same record hash alike, on a primary and on its replicas.

The hottest per-record loops that build or read these rows -- the rows of a bulk load of sorted short
keys, the diff's forward scan of ``records`` and a query page's -- have a compiled twin in ``_accel.c``,
used when it was built (``ACCEL``; None: the pure-Python code here and in diff.py runs, with the same
results).
"""

from __future__ import annotations

import hashlib
import struct
import warnings
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path

import msgpack

from diffstore.errors import CorruptRecord, text_form

try:
    from diffstore.engine import _accel
except ImportError:  # not built (no C compiler at install time): the pure-Python twins run
    _accel = None  # type: ignore[assignment]


def _current(accel: object, source: Path) -> bool:
    """Whether ``accel`` was built from ``source`` as it is now (true when the source is not there:
    nothing to compare with; a wheel ships both, built together). An in-place build outlives a pull that
    changed the source until ``make install`` rebuilds it: the twins are right, the stale build may not
    be."""
    try:
        digest = hashlib.sha256(source.read_bytes()).hexdigest()
    except FileNotFoundError:
        return True
    if getattr(accel, "SOURCE", None) == digest:
        return True
    warnings.warn(
        f"{source.name} changed since {getattr(accel, '__file__', 'the accelerator')} was built: running "
        "the pure-Python code (same results, slower); `make install` rebuilds it",
        RuntimeWarning,
        stacklevel=2,
    )
    return False


if _accel is not None and not _current(_accel, Path(__file__).with_name("_accel.c")):
    _accel = None  # type: ignore[assignment]

ACCEL = _accel
"""The compiled accelerator, or None; read at each call, so a test may swap it for None."""

LONG_KEY_PREFIX = 200
MAX_KEY_LENGTH = (1 << 24) - 1
_SHORT_END = b"\x00\x00"
LONG_MARK = b"\x00\x01"
_LONG_MARK = LONG_MARK
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")

TABLES = (
    b"collections",
    b"gens",
    b"gen_ids",
    b"records",
    b"changes",
    b"phantoms",
    b"phantom_ttl",
    b"readers",
    b"targets",
    b"producers",
    b"leases",
    b"dropped",
    b"due",
    b"lineage",
    b"cursors",
    b"replica",
    b"commits",
    b"change_chunks",
    b"digests",
)

TOMBSTONE = b""
# Rows of ``collections`` that are not collections: their names begin with 00, which no collection's does.
NEXT_CID = b"\x00next_cid"  # the next collection id (u64)
LAYOUT_ROW = b"\x00layout"  # the layout version the store is written in (u64; no row: version 1)
LAYOUT_VERSION = 2  # 1: records keys were cid(u32) | K | seq(u64); see engine/migrate.py
SEALED_ROW = b"\x00sealed"  # present: every record of the store carries its checksum (see sealed values)


def is_collection_row(name: bytes) -> bool:
    """Whether a row of ``collections`` is a collection's (not NEXT_CID, LAYOUT_ROW or SEALED_ROW)."""
    return not name.startswith(b"\x00")


def cid_bytes(cid: int) -> bytes:
    return _U32.pack(cid)


def u64(value: int) -> bytes:
    return _U64.pack(value)


def read_u64(raw: bytes) -> int:
    return int(_U64.unpack(raw)[0])


def cid_of_key(key: bytes) -> int:
    """The collection id that begins every collection-scoped key (records, gens, readers, leases, ...)."""
    return int(_U32.unpack(key[:4])[0])


def after_cid(key: bytes) -> bytes:
    """What follows the collection id in a collection-scoped key: a reader's, lease's or producer's name,
    a generation id (``gen_ids``), a big-endian seq (``gens``, ``commits``)."""
    return key[4:]


def seq_of_gen_key(key: bytes) -> int:
    """The seq of a ``gens`` (or ``commits``) key."""
    return int(_U64.unpack(key[4:12])[0])


def key_form(key: bytes) -> bytes:
    """The order-preserving K of a user key (see the module docstring)."""
    if len(key) <= LONG_KEY_PREFIX:
        return key.replace(b"\x00", b"\x00\xff") + _SHORT_END
    digest = hashlib.blake2b(key, digest_size=16).digest()
    return key[:LONG_KEY_PREFIX].replace(b"\x00", b"\x00\xff") + _LONG_MARK + digest


def is_long_form(form: bytes) -> bool:
    # esc() never emits 00 01 and a short form ends in 00 00, so only a long form holds the mark.
    return _LONG_MARK in form


def long_group(form: bytes) -> bytes:
    """The part of a long K shared by every key of its group."""
    return form[: form.index(_LONG_MARK) + 2]


def short_key_of_form(form: bytes) -> bytes:
    return form[:-2].replace(b"\x00\xff", b"\x00")


def cut_key_of_form(form: bytes) -> bytes:
    """A key at or below every key that K stands for, above those of every lower K: the key itself for a
    short K, the prefix its group shares for a long one (where to cut a key range at K)."""
    if _LONG_MARK in form:
        return form[: form.index(_LONG_MARK)].replace(b"\x00\xff", b"\x00")
    return short_key_of_form(form)


def encode_value(key: bytes, value: bytes | None) -> bytes:
    if len(key) <= LONG_KEY_PREFIX:
        return TOMBSTONE if value is None else b"\x01" + value
    head = len(key).to_bytes(3, "big")
    if value is None:
        return b"\x02" + head + key
    return b"\x03" + head + key + value


# --- sealed record values: tag | 0x10, crc32(records key | plain value), rest ----------------------------

SEALED = 0x10
_CRC = struct.Struct(">I")
SEALING = True
"""Whether writes seal records values; read at each call, so that benchmarks/integrity.py may switch it off
for its baseline (what checksums cost). Nothing else changes it: a store always writes sealed values."""


def seal(record_key: bytes, raw: bytes) -> bytes:
    """The sealed form of the plain record value ``raw`` stored under ``record_key``."""
    if not SEALING:
        return raw
    crc = _CRC.pack(zlib.crc32(raw, zlib.crc32(record_key)))
    if not raw:
        return b"\x10" + crc
    return bytes((raw[0] | SEALED,)) + crc + raw[1:]


def is_sealed(raw: bytes) -> bool:
    return bool(raw) and raw[0] >= SEALED


def plain(raw: bytes) -> bytes:
    """The plain form of a stored record value (a plain one as it is), without verifying it."""
    if not raw or raw[0] < SEALED:
        return raw
    if raw[0] == SEALED:
        return b""
    return bytes((raw[0] & 0x0F,)) + raw[5:]


def seal_fails(record_key: bytes, raw: bytes) -> bool:
    """Whether a sealed stored value does not match its checksum (a plain one never fails: it has none)."""
    if not raw or raw[0] < SEALED:
        return False
    if len(raw) < 5 or raw[0] > SEALED | 3 or (raw[0] == SEALED and len(raw) != 5):
        return True
    return bool(zlib.crc32(plain(raw), zlib.crc32(record_key)) != _CRC.unpack_from(raw, 1)[0])


def unseal(record_key: bytes, raw: bytes) -> bytes:
    """The plain form of the value stored under ``record_key``, verified.

    A plain value (one written before checksums) is returned as it is: a sealed value whose seal bit
    flipped to look like one is caught by ``check`` in a store marked sealed, not here.

    Raises:
        CorruptRecord: the value is sealed and its checksum fails, or its tag is of neither form (the
            message names the key, never the value).
    """
    if not raw or 1 <= raw[0] <= 3:
        return raw
    if raw[0] < SEALED or seal_fails(record_key, raw):  # below: a tag neither form has (a lost seal bit)
        raise corrupt_record(record_key)
    return plain(raw)


def corrupt_record(record_key: bytes) -> CorruptRecord:
    """The error of a records row whose checksum fails: it names the key (as far as a damaged key can be
    read), the collection id and the generation's seq, never the value."""
    parsed = parse_record_key(bytes(record_key))
    if parsed is None:
        return CorruptRecord(f"a stored record fails its checksum (its key is damaged: {record_key.hex()})")
    cid, form, seq = parsed
    key = text_form(cut_key_of_form(form))
    long = "a long key beginning " if is_long_form(form) else "key "
    return CorruptRecord(
        f"the stored record of {long}{key} (collection #{cid}, generation #{seq}) fails its checksum: "
        "the storage underneath changed it (diffstore check lists every damaged row)"
    )


def decode_value(raw: bytes) -> bytes | None:
    """The user value of a stored record value (None: tombstone)."""
    if not raw:
        return None
    tag = raw[0]
    if tag == 1:
        return raw[1:]
    if tag == 2:
        return None
    return raw[4 + int.from_bytes(raw[1:4], "big") :]


def long_key_of_value(raw: bytes) -> bytes:
    """The full user key kept in a long key's record value."""
    return raw[4 : 4 + int.from_bytes(raw[1:4], "big")]


def key_of(form: bytes, raw_value: bytes) -> bytes:
    """The user key of a record from its K and stored value."""
    if raw_value and raw_value[0] >= 2:
        return long_key_of_value(raw_value)
    return short_key_of_form(form)


# --- records: rcid | K | rseq --------------------------------------------------------------
#
# A records key is a *head* (the collection's records prefix, then K) and an encoded seq. Code outside
# this module builds and reads them with the functions below and two facts that any layout of them keeps:
# heads are prefix-free (no head begins another, as no K begins another), so a records key begins with a
# head exactly when it is a version of that head's key, and what follows the head is the encoded seq; and
# encoded seqs sort as the seqs do, so versions are compared without decoding them.


def _short_int(value: int) -> bytes:
    """``value`` big-endian in as few bytes as it needs (at least one)."""
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


def records_prefix(cid: int) -> bytes:
    """What every records key of collection ``cid`` begins with: a length byte, then the cid in that many
    bytes (prefix-free, and shorter than ``cid_bytes`` for all but the 2^24th collection on)."""
    raw = _short_int(cid)
    return bytes((len(raw),)) + raw


def record_head(prefix: bytes, form: bytes) -> bytes:
    """The head of K's versions in the collection whose records ``prefix`` is."""
    return prefix + form


def record_seq(seq: int) -> bytes:
    """The encoded ``seq`` that follows a head: a length byte, the seq in that many bytes (big-endian, as
    few as it needs), the length byte again (so that a key's head ends where its last byte says).
    Encoded seqs sort as the seqs do: more bytes, a greater seq."""
    raw = _short_int(seq)
    length = bytes((len(raw),))
    return length + raw + length


def read_record_seq(encoded: bytes) -> int:
    return int.from_bytes(encoded[1:-1], "big")


def record_key(prefix: bytes, form: bytes, seq: int) -> bytes:
    return prefix + form + record_seq(seq)


def record_head_of(raw: bytes) -> bytes:
    """The head of a records key: the key without its encoded seq."""
    return raw[: -2 - raw[-1]]


def record_form(raw: bytes) -> bytes:
    """K of a records key."""
    return raw[1 + raw[0] : -2 - raw[-1]]


def record_key_of_layout_1(cid: int, form: bytes, seq: int) -> bytes:
    """A records key as layout version 1 wrote it: cid(u32) | K | seq(u64) (``migrate.py`` reads them)."""
    return _U32.pack(cid) + form + _U64.pack(seq)


def parse_record_key_of_layout_1(raw: bytes) -> tuple[int, bytes, int]:
    """(cid, K, seq) of a records key of layout version 1."""
    return int(_U32.unpack(raw[:4])[0]), raw[4:-8], int(_U64.unpack(raw[-8:])[0])


def parse_record_key(raw: bytes) -> tuple[int, bytes, int] | None:
    """(cid, K, seq) of a records-table key; None when it does not have the shape of one (K is at least 2
    bytes, a seq at most 8)."""
    if len(raw) < 7 or not 1 <= raw[0] <= 4 or not 1 <= raw[-1] <= 8:
        return None
    start, end = 1 + raw[0], len(raw) - 2 - raw[-1]
    if end < start + 2 or raw[end] != raw[-1]:
        return None
    return int.from_bytes(raw[1:start], "big"), raw[start:end], int.from_bytes(raw[end + 1 : -1], "big")


def short_rows(
    cid: int, seq: int, latest: dict[bytes, bytes | None], tombstones: bool | None = None
) -> tuple[list[bytes], Callable[[], Iterable[bytes]], list[bytes]]:
    """Keys of ``records``, their stored (sealed) values (each call: a new pass over them), and keys of
    ``changes`` for short keys written in collection ``cid``'s generation ``seq``.

    The bulk path of writes: key_form and encode_value inlined, keys built by comprehensions (measured
    faster here than chains of two-argument maps), and lists of bytes rather than of (key, value)
    tuples, which the cyclic GC would track by the thousand. ``tombstones``: whether a value is None, when
    the caller knows (None: look).
    """
    # one %-format per key instead of two concatenations (the fixed parts escaped for %)
    record_format = _percent(records_prefix(cid)) + b"%s" + _percent(_SHORT_END + record_seq(seq))
    change_format = _percent(change_prefix(cid_bytes(cid), seq)) + b"%s" + _SHORT_END
    escaped = (
        [key.replace(b"\x00", b"\x00\xff") for key in latest]
        if b"\x00" in b"".join(latest)  # one scan of the batch, not one call per key
        else list(latest)
    )
    record_keys = [record_format % key for key in escaped]
    values = latest.values()
    if tombstones is None:
        tombstones = None in values

    def stored() -> Iterable[bytes]:
        if tombstones:
            plain = [TOMBSTONE if value is None else b"\x01" + value for value in values]
            return map(seal, record_keys, plain)
        # built one at a time as LMDB copies them: no batch of value copies held at once
        return map(seal, record_keys, map(b"\x01".__add__, values))  # type: ignore[arg-type]

    return record_keys, stored, [change_format % key for key in escaped]


def sorted_short_rows(cid: int, seq: int, items: object) -> _accel.SortedRows | None:
    """The rows of ``records`` and of ``changes`` for ``items`` written in ``seq``, when the compiled
    accelerator is there and the items are a list of ``(key, value)`` tuples whose short keys strictly
    ascend (a bulk load of sorted keys: no key repeats, no lookup to make); else None.

    The rows are those :func:`short_rows` builds for the same items (tests/engine/test_accel.py), built
    as ``putmulti`` asks for them, into the same row and bytes again once it let go of them: no
    object per row.
    """
    accel = ACCEL
    if accel is None:
        return None
    return accel.sorted_short_rows(
        items, records_prefix(cid), record_seq(seq), change_prefix(cid_bytes(cid), seq), SEALING
    )


def _percent(raw: bytes) -> bytes:
    return raw.replace(b"%", b"%%")


def ascending(keys: list[bytes]) -> bool:
    """Whether the keys, which must be distinct, ascend.

    ``sorted`` of a sorted list is one comparison per key in C (timsort finds one run), and the list
    comparison then meets the same objects: about half the time of comparing neighbours pairwise.
    """
    return keys == sorted(keys)


# --- changes: cid | seq | K ------------------------------------------------------------------


def change_prefix(cid_prefix: bytes, seq: int) -> bytes:
    return cid_prefix + _U64.pack(seq)


def change_key(cid_prefix: bytes, seq: int, form: bytes) -> bytes:
    return cid_prefix + _U64.pack(seq) + form


def split_change_key(raw: bytes) -> tuple[int, bytes]:
    return int(_U64.unpack(raw[4:12])[0]), raw[12:]


# --- change_chunks: cid | seq | K1 -> (len(u16) K)... ------------------------------------------------

CHUNK_BYTES = 1500  # of packed forms per row: with the longest first form (418 bytes) key and value
# still fit one node of a 4 KiB page (at most 2,038 bytes), no overflow page
_U16 = struct.Struct(">H")


def pack_forms(forms: Iterable[bytes]) -> bytes:
    """A chunk's value: each form after its u16 length."""
    return b"".join(_U16.pack(len(form)) + form for form in forms)


def unpack_forms(raw: bytes) -> list[bytes]:
    """The forms of a chunk's value, in order (compiled: ``_accel.unpack_forms``, read per keyed diff).

    Raises:
        ValueError: ``raw`` does not unpack (a length runs past its end).
    """
    accel = ACCEL
    if accel is not None:
        return accel.unpack_forms(raw)
    forms = []
    at, end = 0, len(raw)
    while at < end:
        if end - at < 2:
            raise ValueError("a change_chunks value that does not unpack")
        length = (raw[at] << 8) | raw[at + 1]
        if end - at - 2 < length:
            raise ValueError("a change_chunks value that does not unpack")
        forms.append(raw[at + 2 : at + 2 + length])
        at += 2 + length
    return forms


def chunk_rows(cid_prefix: bytes, seq: int, forms: Iterable[bytes]) -> list[tuple[bytes, bytes]]:
    """The ``change_chunks`` rows of ascending ``forms`` written in ``seq``: each value at most
    ``CHUNK_BYTES`` of packed forms (the compiled ``SortedRows.chunks`` builds the same)."""
    run = change_prefix(cid_prefix, seq)
    rows: list[tuple[bytes, bytes]] = []
    chunk: list[bytes] = []
    used = 0
    for form in forms:
        if chunk and used + 2 + len(form) > CHUNK_BYTES:
            rows.append((run + chunk[0], pack_forms(chunk)))
            chunk, used = [], 0
        chunk.append(form)
        used += 2 + len(form)
    if chunk:
        rows.append((run + chunk[0], pack_forms(chunk)))
    return rows


# --- generations -------------------------------------------------------------------------------


def gen_key(cid_prefix: bytes, seq: int) -> bytes:
    return cid_prefix + _U64.pack(seq)


def gen_id_key(cid_prefix: bytes, generation_id: bytes) -> bytes:
    return cid_prefix + generation_id


def commit_key(cid_prefix: bytes, seq: int) -> bytes:
    return cid_prefix + _U64.pack(seq)


def pack_commit(committed_at_ms: int, changed_keys: int, metadata: dict[str, str] | None) -> bytes:
    return msgpack.packb([committed_at_ms, changed_keys, metadata])  # type: ignore[no-any-return]


def unpack_commit(raw: bytes) -> tuple[int, int, dict[str, str] | None]:
    committed_at_ms, changed_keys, metadata = msgpack.unpackb(raw)
    return int(committed_at_ms), int(changed_keys), metadata


# --- digests: cid | seq -> records(u64) | digest(16 bytes) ------------------------------------------

DIGEST_BYTES = 16


def digest_key(cid_prefix: bytes, seq: int) -> bytes:
    return cid_prefix + _U64.pack(seq)


def digest_start_key(cid_prefix: bytes) -> bytes:
    """The row that says from which seq on every committed generation has a digest."""
    return cid_prefix


def digest_pending_key(cid_prefix: bytes) -> bytes:
    """The row that carries the open generation's digest delta while each of its writes appended new rows
    (digests.record_put): neither a start row (cid) nor a generation's (cid | seq)."""
    return cid_prefix + b"\x00"


def pack_pending(seq: int, writes: int, records: int, digest: int) -> bytes:
    return _U64.pack(seq) + _U64.pack(writes) + _U64.pack(records) + digest.to_bytes(DIGEST_BYTES, "big")


def unpack_pending(raw: bytes) -> tuple[int, int, int, int]:
    """(open seq, writes counted, live records written, their digest sum) of a pending row.

    Raises:
        ValueError: the row is not 24 + 16 bytes.
    """
    if len(raw) != 24 + DIGEST_BYTES:
        raise ValueError(f"a pending digest row of {len(raw)} bytes")
    seq, writes, records = (int(_U64.unpack(raw[i : i + 8])[0]) for i in (0, 8, 16))
    return seq, writes, records, int.from_bytes(raw[24:], "big")


def pack_digest(records: int, digest: int) -> bytes:
    return _U64.pack(records) + digest.to_bytes(DIGEST_BYTES, "big")


def unpack_digest(raw: bytes) -> tuple[int, int]:
    """(live records, digest) of a ``digests`` row.

    Raises:
        ValueError: the row is not 8 + 16 bytes.
    """
    if len(raw) != 8 + DIGEST_BYTES:
        raise ValueError(f"a digests row of {len(raw)} bytes")
    return int(_U64.unpack(raw[:8])[0]), int.from_bytes(raw[8:], "big")


def record_digest(form: bytes, raw_value: bytes) -> int:
    """The hash of one live record that a generation's digest sums (0: a tombstone, which no sum holds).

    K is prefix-free, so ``K | stored value`` names one record; neither holds a seq, so a replica (whose seqs
    may differ) hashes its records alike."""
    raw_value = plain(raw_value)
    if not raw_value or raw_value[0] == 2:
        return 0
    return int.from_bytes(hashlib.blake2b(form + raw_value, digest_size=DIGEST_BYTES).digest(), "big")


# --- replica state (see replication.py) ----------------------------------------------------------

REPLICA_PRIMARY = b"primary"
REPLICA_ID = b"id"
REPLICA_PROMOTED = b"promoted"
REPLICA_APPLIED = b"applied"
REPLICA_LAG = b"lag"
REPLICA_TERM = b"term"
REPLICA_SELF = b"self"
REPLICA_FENCED = b"fenced"
REPLICA_HA = b"ha"  # a fail-over member's role and write deadline (ha_state.py)
REPLICA_STEP_DOWNS = b"stepDowns"  # how many times the store stepped down, ever (a u64)


def replica_lag_key(name: str) -> bytes:
    return REPLICA_LAG + name.encode()


def replica_lag_name(raw: bytes) -> str:
    return raw[len(REPLICA_LAG) :].decode()


# a first copy being staged (engine/first_copy.py): the collection's row and where the copy goes on, kept
# here, not in ``collections``, so that reads do not see the collection until its last batch
REPLICA_STAGED = b"staged/"


def replica_staged_key(name: str) -> bytes:
    return REPLICA_STAGED + name.encode()


def replica_staged_name(raw: bytes) -> str:
    return raw[len(REPLICA_STAGED) :].decode()


# --- phantoms --------------------------------------------------------------------------------


def phantom_prefix(cid_prefix: bytes, phantom: int) -> bytes:
    return cid_prefix + _U64.pack(phantom)


def phantom_id_bytes(phantom: int) -> bytes:
    return _U64.pack(phantom)


PHANTOM_COUNTER_MAX = (1 << 32) - 1


def phantom_of(cid: int, counter: int) -> int:
    """The phantom number of a collection's ``counter``-th phantom: its cid in the high 32 bits, so a
    phantom id names its collection (ids are unique in the store, and one of another collection is told
    apart). Ids made before this scheme have a zero high half and belong to any collection."""
    return (cid << 32) | counter


def phantom_owner(phantom: int) -> int | None:
    """The cid a phantom number was made for, or None for an id of the older, collection-less form."""
    return (phantom >> 32) or None


def phantom_number(phantom_id: bytes) -> int | None:
    """The phantom number of a phantom id, or None when it cannot be one of ours."""
    if len(phantom_id) != 8:
        return None
    return int(_U64.unpack(phantom_id)[0])


# --- readers -----------------------------------------------------------------------------------


def reader_key(cid_prefix: bytes, name: str) -> bytes:
    return cid_prefix + name.encode()


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def target_prefix(target: str) -> bytes:
    return _digest(target)


def target_key(target: str, cid_prefix: bytes, name: str) -> bytes:
    return _digest(target) + cid_prefix + _digest(name)


def owner_of_target_key(raw: bytes) -> int:
    """The owner collection id of a targets-table key."""
    return int(_U32.unpack(raw[16:20])[0])


def producer_key(cid_prefix: bytes, producer_id: str) -> bytes:
    return cid_prefix + producer_id.encode()


# --- leases ----------------------------------------------------------------------------------------


def lease_key(cid_prefix: bytes, name: str) -> bytes:
    return cid_prefix + name.encode()


def lease_name_of_key(raw: bytes) -> str:
    return raw[4:].decode()


def pack_lease(owner: str | None, version: int, expires_at_ms: int, ttl_ms: int) -> bytes:
    return msgpack.packb([owner, version, expires_at_ms, ttl_ms])  # type: ignore[no-any-return]


def unpack_lease(raw: bytes) -> tuple[str | None, int, int, int]:
    """(owner, version, expiresAtMs, ttlMs) of a lease row."""
    owner, version, expires_at_ms, ttl_ms = msgpack.unpackb(raw, raw=False)
    return owner, int(version), int(expires_at_ms), int(ttl_ms)


def next_prefix(prefix: bytes) -> bytes | None:
    """The smallest byte string greater than every string starting with ``prefix`` (None: none)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


# --- due: background work any process may take ----------------------------------------------------


def auto_commit_due_key(name: str) -> bytes:
    return b"a" + name.encode()


def name_of_auto_commit_due_key(raw: bytes) -> str | None:
    """The collection name of an automatic-commit row (None: another kind of row)."""
    return raw[1:].decode() if raw[:1] == b"a" else None


AUTO_COMMIT_DUE_PREFIX = b"a"


def gc_position_key(cid_prefix: bytes) -> bytes:
    return b"g" + cid_prefix


def gc_position(seq: int, form: bytes) -> bytes:
    return _U64.pack(seq) + form


def read_gc_position(raw: bytes) -> tuple[int, bytes]:
    return int(_U64.unpack(raw[:8])[0]), raw[8:]


# --- lineage: the reader moves of each committed generation ------------------------------------


def lineage_prefix(cid_prefix: bytes, seq: int) -> bytes:
    """Where the moves of generation ``seq`` start (and, for a range scan, those of later ones)."""
    return cid_prefix + _U64.pack(seq)


def lineage_key(cid_prefix: bytes, seq: int, name: str) -> bytes:
    return cid_prefix + _U64.pack(seq) + name.encode()


def split_lineage_key(raw: bytes) -> tuple[int, str]:
    """(seq, reader name) of a lineage-table key."""
    return int(_U64.unpack(raw[4:12])[0]), raw[12:].decode()


# --- cursors: the resume positions of page tokens too long for a URL (engine/cursor_spill.py) ---------
# b"e" + digest -> u64 number + the full token; b"a" + u64 number -> digest (the oldest first, to evict);
# CURSOR_TOTALS -> u64 entries + u64 bytes of the stored tokens + u64 the next number
CURSOR_TOTALS = b"t"
CURSOR_AGE_PREFIX = b"a"


def cursor_entry_key(digest: bytes) -> bytes:
    return b"e" + digest


def cursor_age_key(number: int) -> bytes:
    return CURSOR_AGE_PREFIX + _U64.pack(number)


def pack_cursor_entry(number: int, token: bytes) -> bytes:
    return _U64.pack(number) + token


def unpack_cursor_entry(raw: bytes) -> tuple[int, bytes]:
    return _U64.unpack_from(raw)[0], bytes(raw[8:])


def pack_cursor_totals(entries: int, size: int, next_number: int) -> bytes:
    return _U64.pack(entries) + _U64.pack(size) + _U64.pack(next_number)


def unpack_cursor_totals(raw: bytes | None) -> tuple[int, int, int]:
    if raw is None:
        return 0, 0, 0
    return _U64.unpack_from(raw)[0], _U64.unpack_from(raw, 8)[0], _U64.unpack_from(raw, 16)[0]
