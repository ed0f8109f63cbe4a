"""The soak's invariants, checked while the pipeline runs (each call checks what is new since the last).

- :class:`ExactlyOnce`: every record the producer had acknowledged is applied to A once, in one
  generation: the mapper's trace rows (``soak_jobs``) carry each record's sequence number, and each of A's
  generations is diffed against the one before it (a reader of the checker's own holds A's GC back).
- :func:`c_matches_sources`: C equals the job's result over A and B at the generations C's readers name,
  read together with C's generation.
- :func:`view_matches_c`: the consumer's view equals C at the generation the view names.
- :func:`replica_matches`: each collection's digest on the replica equals the primary's at the replica's
  generation.
- :func:`backup_matches`: a backup passes ``check`` and each collection's digest in it equals the
  primary's at the backup's generation.

A check that meets a generation collected meanwhile, or a server that does not answer (a fault is on),
says "not now" (returns False or raises :class:`NotNow`): only a disagreement is a violation.
"""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

from diffstore.client import Client
from diffstore.engine import Store, StoreConfig
from diffstore.errors import DiffstoreError, GenerationCollected, NoSuchGeneration
from tests.soak.soak_jobs import expected_c

CHECK_READER = "soak-check"


class NotNow(Exception):
    """The check could not run now (a server away, a generation collected under it): try again later."""


class Violation(AssertionError):
    """An invariant does not hold."""


def _records(client: Client, name: str, generation: bytes | None) -> dict[bytes, bytes]:
    try:
        return {r.key: r.value for r in client.collection(name).query(generation_id=generation)}
    except (GenerationCollected, NoSuchGeneration) as exc:
        raise NotNow(f"{name} at {generation!r}: {exc}") from exc


class ExactlyOnce:
    """Follows A generation by generation, holding its GC back with a reader of its own."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.seen: dict[int, bytes] = {}  # sequence number → the generation that applied it
        self.position: bytes | None = None

    def start(self) -> None:
        a = self.client.collection("A")
        if not any(r.name == CHECK_READER for r in a.readers()):
            a.create_reader(CHECK_READER, "A", None)

    def step(self, limit: int = 200) -> int:
        """Checks up to ``limit`` new generations of A; returns how many."""
        a = self.client.collection("A")
        newer = self._generations_after(self.position, limit)
        for generation in newer:
            for item in a.diff(from_generation_id=self.position or b"", to_generation_id=generation):
                if item.key.startswith(b"rec/") and item.to_value is not None:
                    seq = int(item.to_value.split(b":", 1)[0])
                    if seq in self.seen:
                        raise Violation(
                            f"record {seq} applied in {self.seen[seq]!r} and again in {generation!r}"
                        )
                    self.seen[seq] = generation
            self.position = generation
            a.update_reader(CHECK_READER, generation)
        return len(newer)

    def _generations_after(self, position: bytes | None, limit: int) -> list[bytes]:
        a = self.client.collection("A")
        found: list[bytes] = []
        before: bytes | None = None
        while True:  # newest first: page back to the position
            ids, more = a.generations(before, 500)
            older = [g for g in ids if position is None or g > position]
            found.extend(older)
            if len(older) < len(ids) or not more or not ids:
                break
            before = ids[-1]
        return sorted(found)[:limit]

    def missing(self, acknowledged: set[int]) -> list[int]:
        return sorted(acknowledged - self.seen.keys())


def c_matches_sources(client: Client) -> None:
    c = client.collection("C")
    for _ in range(5):
        generation = c.generation_id
        readers = {r.name: r.generation_id for r in c.readers()}
        if c.generation_id == generation:
            break
    else:
        raise NotNow("C kept committing while its readers were read")
    if "from_a" not in readers or "from_b" not in readers or not generation:
        raise NotNow("C has no round yet")
    a = _records(client, "A", readers["from_a"] or b"")
    b = _records(client, "B", readers["from_b"] or b"")
    c_now = _records(client, "C", generation)
    expected = expected_c(a, b)
    if c_now != expected:
        raise Violation(f"C at {generation!r} differs from A+B at {readers}: {_difference(c_now, expected)}")


def view_matches_c(client: Client, view_file: Path) -> bytes:
    try:
        saved = json.loads(view_file.read_text())
    except FileNotFoundError as exc:
        raise NotNow("no view yet") from exc
    generation = base64.b64decode(saved["generation"])
    view = {base64.b64decode(k): base64.b64decode(v) for k, v in saved["records"].items()}
    c_then = _records(client, "C", generation) if generation else {}
    if view != c_then:
        raise Violation(f"the consumer's view at {generation!r} differs from C: {_difference(view, c_then)}")
    return generation


def replica_matches(primary: Client, replica: Client, names: list[str]) -> int:
    """Compares each collection's digest at the replica's generation; returns how many matched."""
    matched = 0
    for name in names:
        try:
            theirs = replica.collection(name).digest()
        except DiffstoreError as exc:
            raise NotNow(f"replica {name}: {exc}") from exc
        if not theirs.generation_id:
            continue
        try:
            ours = primary.collection(name).digest(theirs.generation_id)
        except (GenerationCollected, NoSuchGeneration):
            continue
        if (ours.records, ours.digest) != (theirs.records, theirs.digest):
            raise Violation(f"replica's {name} at {theirs.generation_id!r} differs: {theirs} against {ours}")
        matched += 1
    return matched


def backup_matches(primary: Client, backup: Path, diffstore: list[str], names: list[str]) -> int:
    checked = subprocess.run([*diffstore, "check", "--data", str(backup)], capture_output=True, text=True)
    if checked.returncode != 0:
        said = checked.stdout[-2000:] + checked.stderr[-2000:]
        raise Violation(f"check of the backup {backup} failed: {said}")
    matched = 0
    with Store.open(backup, StoreConfig(background=False)) as store:
        for name in names:
            copy = store.collection(name).digest()
            if not copy.generation_id:
                continue
            try:
                source = primary.collection(name).digest(copy.generation_id)
            except (GenerationCollected, NoSuchGeneration):
                continue
            if (source.records, source.digest) != (copy.records, copy.digest):
                raise Violation(f"backup's {name} at {copy.generation_id!r} differs from the primary's")
            matched += 1
    return matched


def _difference(ours: dict[bytes, bytes], theirs: dict[bytes, bytes]) -> str:
    keys = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
    shown = ", ".join(f"{k!r}: {ours.get(k)!r} vs {theirs.get(k)!r}" for k in keys[:5])
    return f"{len(keys)} keys differ ({shown})"
