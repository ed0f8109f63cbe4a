"""Transform previews: what one round would write into the target if the sources' phantoms were committed.

``Transform.preview(phantoms={"a": phantom_id})`` answers "what would C look like if A changed like
this?" without committing anything: it runs the transform's ``fn`` once, on the driver, over the diffs
a round would see, and writes the result into a new *phantom* of the target, so that a ``query`` (or a
``get``) carrying that phantom id shows C as it would be.

What "one round, if the phantoms were committed" means, precisely. For each source S with reader R
(the target's ``from_<alias>``; null means from the beginning) and current generation G:

* a source without a phantom is read as a round would read it now: the diff (R, G], and lookups at G;
* a source with phantom P is read as if P's changes were committed as one more generation G' above G,
  and the round then read (R, G']: every key changed in (R, G] or by P (:meth:`phantom_changes` at G)
  appears once, with ``fromValue`` the value at R and ``toValue`` the value P shows at G (a key whose
  two values end up equal is left out, as a diff leaves it out); lookups read S at G *with* P. So when
  the reader is behind G, the preview includes the committed changes the next round would catch up on
  too, exactly as the real round after committing P would — not P's changes alone on top of a
  reader that never saw (R, G].
* the target is read (``lookup(TARGET, …)``) at its current generation B, as a real round reads it.

``fn``'s result goes into a new phantom of the target, written at generation B: a read of the target
with that phantom (at B, which is its current generation until someone commits) sees the round's writes
over B, deletes included. It expires after ``ttl_seconds`` (default :data:`DEFAULT_TTL_SECONDS`).

Nothing moves: no generation is started or committed, no reader is created or updated, the sources'
phantoms are only read. The preview runs on the driver (diffs read over HTTP into local DataFrames,
lookups by ``getMany`` from here, the result collected and written with putMany), so it is meant for
small changes: when a source's diff holds more than ``max_rows`` changes it is refused with
:class:`PreviewTooLarge` (catch the target up with a real run first, or raise ``max_rows``). A real round
over a range the server splits (very large ranges) would stop short of G; a preview never does.

Phantom ids are taken as the ``phantomId`` EncodedString that ``phantom/start`` answers (a
``{"value", "encoding"}`` map) or as raw bytes, and the new one is given back as such a map.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from diffstore.client import Collection
from diffstore.engine.types import DiffItem
from diffstore.errors import InvalidRequest
from diffstore.rounds import source_reader
from diffstore.spark.plan import TARGET, Pinned, RoundContext
from diffstore.spark.schemas import DIFF_SCHEMA
from diffstore.spark.small_rounds import driver_lookup
from diffstore.wire import decode_es, encode_es

DEFAULT_TTL_SECONDS = 3600
"""How long a preview's phantom lives (as ``phantom/start``'s default)."""
DEFAULT_MAX_ROWS = 10_000
"""The most changes a source's diff may hold for a preview (previews run on the driver)."""

PhantomIdLike = bytes | bytearray | Mapping[str, Any]
"""A phantom id: raw bytes, or the EncodedString map that ``phantom/start`` answers."""

_CHUNK = 5_000  # rows per putMany
_PAGE = 10_000  # the server's largest page


class PreviewTooLarge(InvalidRequest):
    """A source's diff holds more changes than a driver-side preview takes."""


def phantom_id(value: PhantomIdLike, what: str = "phantomId") -> bytes:
    """The bytes of a phantom id given as bytes or as an EncodedString map.

    Raises:
        InvalidRequest / InvalidEncoding: anything else, or an empty id.
    """
    if isinstance(value, bytes | bytearray):
        raw = bytes(value)
    elif isinstance(value, Mapping):
        raw = decode_es(value, what)
    else:
        raise InvalidRequest(
            f"{what}: expected the EncodedString map phantom/start answers, or bytes, "
            f"not {type(value).__name__}"
        )
    if not 1 <= len(raw) <= 255:
        raise InvalidRequest(f"{what}: a phantom id is 1..255 bytes")
    return raw


@dataclass(frozen=True, slots=True)
class PreviewSource:
    """What the preview reads of one source: (reader, current] plus, optionally, a phantom at current."""

    alias: str
    collection: str
    from_generation_id: bytes
    to_generation_id: bytes
    phantom_id: bytes | None


def run_preview(
    transform: RoundContext,
    phantoms: Mapping[str, PhantomIdLike],
    *,
    ttl_seconds: int = DEFAULT_TTL_SECONDS,
    max_rows: int = DEFAULT_MAX_ROWS,
) -> dict[str, str]:
    """Runs ``transform.fn`` once as a preview (see the module docstring); returns the new phantom id.

    Raises:
        InvalidRequest: an unknown alias, a bad phantom id, a phantom that is not a live phantom of its
            source, a target that is not manual or whose reader tracks another collection.
        PreviewTooLarge: a source's diff holds more than ``max_rows`` changes.
        NoSuchCollection: the target or a source does not exist.
    """
    unknown = sorted(set(phantoms) - set(transform.sources))
    if unknown:
        raise InvalidRequest(
            f"preview: unknown source {', '.join(map(repr, unknown))}; the sources are "
            f"{', '.join(map(repr, sorted(transform.sources)))}"
        )
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int) or ttl_seconds < 1:
        raise InvalidRequest("preview: ttl_seconds must be a positive whole number")
    ids = {alias: phantom_id(value, f"phantom of source {alias!r}") for alias, value in phantoms.items()}
    target = transform.handle(transform.target)
    state = target.state()
    if not state.manual:
        raise InvalidRequest(f"the target {transform.target!r} must be a manual collection")
    base = state.generation_id or b""
    plan = _plan(transform, target, ids)
    diffs = {s.alias: _diff(transform, s, max_rows) for s in plan}
    frames = {alias: transform.spark.createDataFrame(table, DIFF_SCHEMA) for alias, table in diffs.items()}
    # sources at their current generation with their phantom, the target at ``base``
    pinned = {s.alias: Pinned(s.collection, s.to_generation_id, s.phantom_id) for s in plan}
    pinned[TARGET] = Pinned(transform.target, base)
    lookup = driver_lookup(transform.spark, transform.handle, pinned)
    result = transform.fn(transform.spark, frames, lookup).select("key", "value").toArrow()
    keys, values = result.column("key").to_pylist(), result.column("value").to_pylist()
    if any(key is None for key in keys):
        raise InvalidRequest("the transform's result holds a null key")
    made = target.start_phantom(ttl_seconds)
    items = list(zip(keys, values, strict=True))
    for start in range(0, len(items), _CHUNK):
        target.put_many(items[start : start + _CHUNK], generation_id=base, phantom_id=made)
    transform.event("previewed", phantom_id=made, generation=base, rows_written=len(items))
    return encode_es(made)


def _plan(transform: RoundContext, target: Collection, ids: Mapping[str, bytes]) -> list[PreviewSource]:
    """Each source's range (reader, current] and phantom, checking readers without creating any."""
    stored = {r.name: r for r in target.readers()}
    plan = []
    for alias, collection in transform.sources.items():
        reader = stored.get(source_reader(alias))
        if reader is not None and reader.collection != collection:
            raise InvalidRequest(
                f"reader {reader.name!r} of {transform.target!r} tracks {reader.collection!r}, "
                f"not {collection!r}"
            )
        start = (reader.generation_id if reader is not None else None) or b""
        handle = transform.handle(collection)
        current = handle.generation_id
        phantom = ids.get(alias)
        if phantom is not None:  # a bad id is named before any diff is read
            with _naming(alias, collection):
                handle.phantom_changes(phantom, current, limit=1)
        plan.append(PreviewSource(alias, collection, start, current, phantom))
    return plan


@contextlib.contextmanager
def _naming(alias: str, collection: str) -> Iterator[None]:
    """Puts the source in the message of an error about its phantom id."""
    try:
        yield
    except PreviewTooLarge:
        raise
    except InvalidRequest as exc:
        raise type(exc)(f"phantom of source {alias!r} ({collection}): {exc.reason}") from exc


def _diff(transform: RoundContext, source: PreviewSource, max_rows: int) -> pa.Table:
    """The source's diff as the round would read it: (reader, current], with its phantom's changes on top."""
    handle = transform.handle(source.collection)
    changed: dict[bytes, list[bytes | None]] = {}

    def absorb(items: Iterable[DiffItem]) -> None:
        """Adds changes on top of ``changed``: a key keeps its first fromValue and its last toValue."""
        for item in items:
            entry = changed.get(item.key)
            if entry is not None:
                entry[1] = item.to_value
                continue
            changed[item.key] = [item.from_value, item.to_value]
            if len(changed) > max_rows:
                raise PreviewTooLarge(
                    f"preview: source {source.alias!r} ({source.collection}) has more than {max_rows} "
                    "changes to preview; previews run on the driver: catch the target up with a real run "
                    "first, or raise max_rows"
                )

    if source.from_generation_id != source.to_generation_id:
        # a split range comes back as several pages
        absorb(handle.diff(source.from_generation_id, source.to_generation_id, limit=_PAGE))
    if source.phantom_id is not None:
        with _naming(source.alias, source.collection):
            absorb(every_phantom_change(handle, source.phantom_id, source.to_generation_id))
    rows = sorted((key, old, new) for key, (old, new) in changed.items() if old != new)
    columns = [pa.array([row[i] for row in rows], pa.binary()) for i in range(3)]
    return pa.Table.from_arrays(columns, names=["key", "fromValue", "toValue"])


def every_phantom_change(handle: Collection, phantom: bytes, generation: bytes) -> Iterator[DiffItem]:
    """Every change of ``phantom`` at ``generation``, page after page (``phantom/changes``)."""
    page = handle.phantom_changes(phantom, generation, limit=_PAGE)
    yield from page.items
    while page.next_key is not None:
        page = handle.phantom_changes(phantom, generation, page.next_key, limit=_PAGE)
        yield from page.items
