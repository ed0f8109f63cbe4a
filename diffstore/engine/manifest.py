"""A backup's proof: ``MANIFEST.json`` beside the copy, with each file's SHA-256 and the store's digests.

Every finished backup (``diffstore backup --data`` and ``--url``, of a diffstore store or of a stream
server's) holds one, written before the backup's unfinished mark is removed, so a backup without its mark
always has its manifest::

    {"format": "diffstore-backup-manifest", "version": 1, "kind": "diffstore store",
     "createdAtMs": 1764400000000, "lmdbTxnId": 1234,
     "files": [{"name": "data.mdb", "bytes": 16384, "sha256": "9f86..."}],
     "digests": [{"collection": "A", "generationId": "g2", "generationIdHex": "6732", "records": 3,
                  "digest": "5f0c..."}]}

``digests`` holds each collection's digest at its current generation (engine/digests.py; ``null`` where the
store has none yet). :func:`verify` re-reads every file and compares its size and sum, then each digest with
the one the store holds at that generation; ``diffstore check`` on a backup runs it before anything else,
and ``backup --verify`` right after writing. A store opened for writing after its backup (a restore that
served) has moved past its manifest: LMDB's transaction id tells, and the manifest then no longer applies
(a note, not a problem).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lmdb

from diffstore.engine import digests, files, layout, storage
from diffstore.engine.meta import CollectionMeta
from diffstore.engine.tables import Tables
from diffstore.engine.types import wall_clock_ms
from diffstore.errors import text_form

MANIFEST_FILE = "MANIFEST.json"
FORMAT = "diffstore-backup-manifest"
VERSION = 1
_CHUNK = 1 << 20


@dataclass(slots=True)
class Verified:
    """What verifying a manifest found: problems (the backup is not what was written) and notes."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write(out: Path) -> dict[str, Any]:
    """Writes the manifest of the (settled) copy in ``out``, flushed; returns it. ``out`` may still hold its
    unfinished mark."""
    data = out / storage.DATA_FILE
    with files.opened_environment(out, unfinished_backup=True) as opened:
        txn_id = opened.env.info()["last_txnid"]
        kind = opened.kind
        found = _digests(opened.env) if kind is files.Kind.STORE else []
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "kind": kind.value,
        "createdAtMs": wall_clock_ms(),
        "lmdbTxnId": txn_id,
        "files": [{"name": storage.DATA_FILE, "bytes": data.stat().st_size, "sha256": sha256_of(data)}],
        "digests": found,
    }
    temp = out / (MANIFEST_FILE + ".tmp")
    with temp.open("w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    temp.rename(out / MANIFEST_FILE)
    files.sync_directory(out)
    return manifest


def _digests(env: lmdb.Environment) -> list[dict[str, Any]]:
    tables = Tables.open(env)
    found = []
    with env.begin() as txn:
        for raw_name, raw in txn.cursor(db=tables.collections):
            if not layout.is_collection_row(raw_name):
                continue
            meta = CollectionMeta.unpack(bytes(raw_name).decode(), bytes(raw))
            at = digests.at(txn, tables, meta, meta.generation)
            found.append(
                {
                    "collection": meta.name,
                    "generationId": text_form(meta.generation),
                    "generationIdHex": meta.generation.hex(),
                    "records": at.records,
                    "digest": at.hex,
                }
            )
    return found


def verify(path: Path) -> Verified:
    """Verifies the manifest of the backup in ``path`` (none there: nothing to verify, and a note says so)."""
    result = Verified()
    where = path / MANIFEST_FILE
    if not where.exists():
        result.notes.append(
            f"{path} holds no {MANIFEST_FILE}: nothing proves it is the backup that was written"
        )
        return result
    try:
        manifest = json.loads(where.read_text())
        if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
            raise ValueError(f"not a manifest of version {VERSION}")
        listed = [(str(f["name"]), int(f["bytes"]), str(f["sha256"])) for f in manifest["files"]]
        expected_digests = [
            (str(d["collection"]), bytes.fromhex(d["generationIdHex"]), d["records"], d["digest"])
            for d in manifest["digests"]
        ]
        txn_id = int(manifest["lmdbTxnId"])
    except (ValueError, KeyError, TypeError) as exc:
        result.problems.append(f"{MANIFEST_FILE} does not parse ({exc})")
        return result
    with files.open_existing(path) as opened:
        now_id = opened.env.info()["last_txnid"]
        if now_id != txn_id:
            result.notes.append(
                f"the store was written since its backup (transaction {now_id}, the manifest's {txn_id}):"
                f" its {MANIFEST_FILE} no longer applies"
            )
            return result
        for name, size, sha in listed:
            file = path / name
            if file.resolve().parent != path.resolve() or not file.is_file():
                result.problems.append(f"{name}: listed in {MANIFEST_FILE}, missing from the backup")
                continue
            if file.stat().st_size != size:
                result.problems.append(f"{name}: {file.stat().st_size:,} bytes, the manifest says {size:,}")
            elif sha256_of(file) != sha:
                result.problems.append(f"{name}: its SHA-256 is not the one in {MANIFEST_FILE}")
        if result.problems or opened.kind is not files.Kind.STORE:
            return result  # a file that is not what was written: its digests mean nothing
        tables = Tables.open(opened.env)
        with opened.env.begin() as txn:
            for name, generation_id, records, digest in expected_digests:
                raw = txn.get(name.encode(), db=tables.collections)
                if raw is None:
                    result.problems.append(f"{name!r}: in {MANIFEST_FILE}, not in the store")
                    continue
                at = digests.at(txn, tables, CollectionMeta.unpack(name, bytes(raw)), generation_id)
                if (at.records, at.hex) != (records, digest):
                    result.problems.append(
                        f"{name!r}: the digest at {text_form(generation_id)} is {at.records} records"
                        f" {at.hex}, the manifest says {records} records {digest}"
                    )
    return result
