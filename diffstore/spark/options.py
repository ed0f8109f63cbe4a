"""Parsing of the ``diffstore`` data source options, free of Spark so it can be tested alone.

Spark hands options over as a case-insensitive ``str → str`` mapping. Generation ids are bytes, so every
generation option is read as UTF-8 text unless ``generationIdEncoding`` is ``base64`` (the transform runner
always passes base64 so that any generation id survives the trip).

Every mode (batch read, batch write, stream read, stream write) has its list of options; an option that
is not on the mode's list is an error naming the valid ones, so that a misspelling (``fromReadr``) cannot
silently change what is read.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from diffstore.engine.types import MAX_LEASE_VERSION, LeaseToken
from diffstore.errors import InvalidRequest
from diffstore.tls import ClientTls, ShippedTls

DEFAULT_PARTITIONS = 4
DEFAULT_PAGE_LIMIT = 10_000
DEFAULT_BATCH_ROWS = 5_000
DEFAULT_STREAM_SOURCE_READER = "spark_stream"
DEFAULT_STREAM_SINK_READER = "spark_sink"


_CONNECTION_OPTIONS = ("url", "collection", "codec", "token", "caFile", "clientCert", "clientKey")
READ_OPTIONS = frozenset(
    (
        *_CONNECTION_OPTIONS,
        "generationIdEncoding",
        "generationId",
        "fromGenerationId",
        "fromReader",
        "fromReaderCollection",
        "toGenerationId",
        "partitions",
        "pageLimit",
        "splitKeys",
    )
)
WRITE_OPTIONS = frozenset(
    (
        *_CONNECTION_OPTIONS,
        "generationIdEncoding",
        "generationId",
        "commit",
        "abortOnFailure",
        "updateReaders",
        "batchRows",
        "leaseName",
        "leaseVersion",
    )
)
STREAM_READ_OPTIONS = frozenset(
    (*_CONNECTION_OPTIONS, "startingGeneration", "generationIdEncoding", "readerName", "pageLimit")
)
STREAM_WRITE_OPTIONS = frozenset((*_CONNECTION_OPTIONS, "batchRows", "readerName"))
# Options Spark itself adds to what the user gave (a streaming query's checkpoint; load(path)'s path).
_SPARK_OPTIONS = frozenset(("checkpointlocation", "path"))


def check_known(options: Mapping[str, str], valid: Iterable[str], mode: str) -> None:
    """Raises ``InvalidRequest`` naming every option of ``options`` that is not in ``valid`` (compared
    case-insensitively, as Spark does) and listing the valid ones."""
    names = {name.lower(): name for name in valid}
    unknown = sorted(key for key in options if key.lower() not in names and key.lower() not in _SPARK_OPTIONS)
    if not unknown:
        return
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key.lower(), list(names), n=1, cutoff=0.75)
        hints.append(f"{key!r} (did you mean {names[close[0]]!r}?)" if close else repr(key))
    valid_list = ", ".join(sorted(names.values()))
    raise InvalidRequest(f"unknown diffstore {mode} option {', '.join(hints)}; valid options: {valid_list}")


def _get(options: Mapping[str, str], name: str) -> str | None:
    # Spark lower-cases option names; accept both spellings when handed a plain dict.
    value = options.get(name)
    if value is None:
        value = options.get(name.lower())
    return value


def _int(options: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    text = _get(options, name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError as exc:
        raise InvalidRequest(f"option {name} must be an integer, got {text!r}") from exc
    if not low <= value <= high:
        raise InvalidRequest(f"option {name} must be within {low}..{high}, got {value}")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = _get(options, name)
    if text is None:
        return default
    if text.lower() not in ("true", "false"):
        raise InvalidRequest(f"option {name} must be true or false, got {text!r}")
    return text.lower() == "true"


def encode_generation(value: bytes | None) -> str | None:
    """How the runner passes a generation id in an option (with ``generationIdEncoding=base64``)."""
    return None if value is None else base64.b64encode(value).decode("ascii")


@dataclass(frozen=True, slots=True)
class Connection:
    """Where the data source talks to: server, collection, wire codec, bearer token (if any) and, for an
    ``https://`` server, the client's TLS files by content (:class:`~diffstore.tls.ShippedTls`: read where
    the options are parsed, on Spark's driver, and shipped with the tasks to executors that lack them)."""

    url: str
    collection: str
    codec: str
    token: str | None = field(default=None, repr=False)
    tls: ShippedTls | None = None


def _connection(options: Mapping[str, str]) -> Connection:
    url, collection = _get(options, "url"), _get(options, "collection")
    if not url or collection is None:
        raise InvalidRequest("the diffstore data source needs the options url and collection")
    codec = _get(options, "codec") or "msgpack"
    if codec not in ("msgpack", "json"):
        raise InvalidRequest(f"option codec must be msgpack or json, got {codec!r}")
    return Connection(url, collection, codec, _get(options, "token") or None, _shipped_tls(options))


def _shipped_tls(options: Mapping[str, str]) -> ShippedTls | None:
    """The TLS files of options ``caFile``, ``clientCert`` and ``clientKey`` (paths where the options are
    parsed: Spark's driver), else of the driver's ``DIFFSTORE_CA_FILE``, ``DIFFSTORE_CLIENT_CERT`` and
    ``DIFFSTORE_CLIENT_KEY`` (and ``DIFFSTORE_CLIENT_KEY_PASSWORD``), read into memory."""
    crt, key = _get(options, "clientCert"), _get(options, "clientKey")
    if key and not crt:
        raise InvalidRequest("option clientKey needs the option clientCert")
    files = ClientTls.resolve(_get(options, "caFile") or None, (crt, key or crt) if crt else None, os.environ)
    return ShippedTls.read(files)


def _generation(options: Mapping[str, str], name: str) -> bytes | None:
    text = _get(options, name)
    if text is None:
        return None
    encoding = (_get(options, "generationIdEncoding") or "utf8").lower()
    if encoding == "utf8":
        return text.encode()
    if encoding == "base64":
        try:
            return base64.b64decode(text, validate=True)
        except binascii.Error as exc:
            raise InvalidRequest(f"option {name} is not valid base64") from exc
    raise InvalidRequest(f"option generationIdEncoding must be utf8 or base64, got {encoding!r}")


@dataclass(frozen=True, slots=True)
class SparkReadOptions:
    """What to read: a snapshot (``is_diff`` false) or a diff, and how to cut it into partitions."""

    connection: Connection
    generation_id: bytes | None
    from_generation_id: bytes | None
    from_reader: str | None
    from_reader_collection: str | None
    to_generation_id: bytes | None
    partitions: int
    page_limit: int
    split_keys: tuple[bytes, ...] | None = None

    @property
    def is_diff(self) -> bool:
        return self.from_reader is not None or self.from_generation_id is not None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SparkReadOptions:
        """Validates the reading options (raises ``InvalidRequest``)."""
        check_known(options, READ_OPTIONS, "read")
        parsed = cls(
            connection=_connection(options),
            generation_id=_generation(options, "generationId"),
            from_generation_id=_generation(options, "fromGenerationId"),
            from_reader=_get(options, "fromReader"),
            from_reader_collection=_get(options, "fromReaderCollection"),
            to_generation_id=_generation(options, "toGenerationId"),
            partitions=_int(options, "partitions", DEFAULT_PARTITIONS, 1, 1024),
            page_limit=_int(options, "pageLimit", DEFAULT_PAGE_LIMIT, 1, 10_000),
            split_keys=_split_keys(options),
        )
        if parsed.from_reader is not None and parsed.from_generation_id is not None:
            raise InvalidRequest("give fromGenerationId or fromReader, not both")
        if parsed.is_diff and parsed.generation_id is not None:
            raise InvalidRequest("generationId is for snapshots; a diff takes toGenerationId")
        if not parsed.is_diff and parsed.to_generation_id is not None:
            raise InvalidRequest("toGenerationId needs fromGenerationId or fromReader")
        return parsed


@dataclass(frozen=True, slots=True)
class SparkWriteOptions:
    """Where to write (an open generation of a manual collection) and whether the driver commits."""

    connection: Connection
    generation_id: bytes
    commit: bool
    abort_on_failure: bool
    update_readers: tuple[dict[str, Any], ...]
    batch_rows: int
    lease: LeaseToken | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SparkWriteOptions:
        """Validates the writing options (raises ``InvalidRequest``).

        ``updateReaders`` is a JSON list of ``{"readerName", "generationId", "expectedGenerationId"?}``
        whose generation ids are strings in ``generationIdEncoding`` (or null).
        """
        check_known(options, WRITE_OPTIONS, "write")
        generation_id = _generation(options, "generationId")
        if generation_id is None:
            raise InvalidRequest("writing needs the option generationId (an open generation)")
        updates: list[dict[str, Any]] = []
        text = _get(options, "updateReaders")
        if text:
            try:
                entries = json.loads(text)
            except ValueError as exc:
                raise InvalidRequest("option updateReaders must be a JSON list") from exc
            for entry in entries:
                update: dict[str, Any] = {"readerName": str(entry["readerName"])}
                for field in ("generationId", "expectedGenerationId"):
                    if field in entry:
                        raw = entry[field]
                        update[field] = (
                            None if raw is None else _generation({field: raw, **_enc(options)}, field)
                        )
                update.setdefault("generationId", None)
                updates.append(update)
        return cls(
            connection=_connection(options),
            generation_id=generation_id,
            commit=_bool(options, "commit", True),
            abort_on_failure=_bool(options, "abortOnFailure", True),
            update_readers=tuple(updates),
            batch_rows=_int(options, "batchRows", DEFAULT_BATCH_ROWS, 1, 100_000),
            lease=_lease(options),
        )


def _lease(options: Mapping[str, str]) -> LeaseToken | None:
    """``leaseName`` + ``leaseVersion``: the fencing token the open generation was started under."""
    name = _get(options, "leaseName")
    if name is None and _get(options, "leaseVersion") is None:
        return None
    if not name:
        raise InvalidRequest("option leaseVersion needs leaseName")
    version = _int(options, "leaseVersion", 0, 1, MAX_LEASE_VERSION)
    if version == 0:
        raise InvalidRequest("option leaseName needs leaseVersion")
    return LeaseToken(name, version)


def encode_split_keys(keys: list[bytes]) -> str:
    """How the runner passes the cut points of a read in the option ``splitKeys``."""
    return json.dumps([base64.b64encode(key).decode("ascii") for key in keys])


def _split_keys(options: Mapping[str, str]) -> tuple[bytes, ...] | None:
    """``splitKeys``: a JSON list of base64 keys, strictly ascending, used instead of ``/splits``."""
    text = _get(options, "splitKeys")
    if text is None:
        return None
    try:
        keys = tuple(base64.b64decode(item, validate=True) for item in json.loads(text))
    except (ValueError, TypeError, binascii.Error) as exc:
        raise InvalidRequest("option splitKeys must be a JSON list of base64 strings") from exc
    if any(a >= b for a, b in zip(keys, keys[1:], strict=False)):
        raise InvalidRequest("option splitKeys must be strictly ascending")
    return keys


def _enc(options: Mapping[str, str]) -> dict[str, str]:
    encoding = _get(options, "generationIdEncoding")
    return {} if encoding is None else {"generationIdEncoding": encoding}


@dataclass(frozen=True, slots=True)
class SparkStreamReadOptions:
    """Options of the streaming source; ``starting`` is ``"earliest"``, ``"latest"`` or a generation id."""

    connection: Connection
    starting: str | bytes
    reader_name: str
    page_limit: int

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SparkStreamReadOptions:
        check_known(options, STREAM_READ_OPTIONS, "stream read")
        text = _get(options, "startingGeneration")
        starting: str | bytes
        if text is None or text.lower() in ("earliest", "latest"):
            starting = (text or "earliest").lower()
        else:
            starting = _generation(options, "startingGeneration") or b""
        return cls(
            connection=_connection(options),
            starting=starting,
            reader_name=_get(options, "readerName") or DEFAULT_STREAM_SOURCE_READER,
            page_limit=_int(options, "pageLimit", 10_000, 1, 10_000),
        )


@dataclass(frozen=True, slots=True)
class SparkStreamWriteOptions:
    connection: Connection
    reader_name: str
    batch_rows: int

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SparkStreamWriteOptions:
        check_known(options, STREAM_WRITE_OPTIONS, "stream write")
        return cls(
            connection=_connection(options),
            reader_name=_get(options, "readerName") or DEFAULT_STREAM_SINK_READER,
            batch_rows=_int(options, "batchRows", 5_000, 1, 100_000),
        )
