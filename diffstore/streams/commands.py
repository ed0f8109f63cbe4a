"""``diffstore streams create|ls|rm|subscribe|produce|consume``: streams and records from the shell.

Each command talks to an HStream-compatible server (``diffstore streams serve`` or HStreamDB) at
``--hstream``/``HSTREAM_URL`` (default ``hstream://127.0.0.1:6570``) and takes ``--format text|json``.
Payloads are printed in the text form of :mod:`diffstore.shell` (printable UTF-8 as is, else
``base64:...``). Failures are raised as :class:`~diffstore.errors.DiffstoreError` (see
:func:`stream_errors`); ``diffstore.cli.main`` prints them as one line.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import orjson

from diffstore import shell
from diffstore.errors import (
    BadRequest,
    Conflict,
    DiffstoreError,
    InvalidRequest,
    NotFound,
    StorageError,
)
from diffstore.streams import DEFAULT_PORT

if TYPE_CHECKING:
    from diffstore.streams.client import StreamClient

DEFAULT_HSTREAM_URL = f"hstream://127.0.0.1:{DEFAULT_PORT}"
CONNECT_TIMEOUT_S = 2.0
"""How long a command waits for the server to take a connection before it says it cannot reach it."""


HSTREAM_CA_FILE_ENV = "HSTREAM_CA_FILE"
HSTREAM_CA_FILE_HELP = (
    "PEM file of the authority that signed an hstreams:// server's certificate, for a private CA"
    f" (env {HSTREAM_CA_FILE_ENV}; default: the system's authorities)"
)


def add_hstream_ca_argument(parser: Any) -> None:
    """``--hstream-ca-file F`` (default ``$HSTREAM_CA_FILE``) on a parser."""
    parser.add_argument(
        "--hstream-ca-file",
        metavar="F",
        default=os.environ.get(HSTREAM_CA_FILE_ENV),
        help=HSTREAM_CA_FILE_HELP,
    )


def hstream_roots(path: str | None) -> bytes | None:
    """The PEM roots of ``--hstream-ca-file`` (None: the system's).

    Raises:
        InvalidRequest: the file unreadable, named in one line.
    """
    if path is None:
        return None
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        raise InvalidRequest(f"--hstream-ca-file {path}: {exc.strerror or exc}") from exc


def hstream_options() -> argparse.ArgumentParser:
    """``--hstream`` and ``--format``, shared by every stream command (an argparse parent parser)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--hstream",
        metavar="URL",
        default=os.environ.get("HSTREAM_URL", DEFAULT_HSTREAM_URL),
        help=f"hstream://host[:port] or hstreams:// (env HSTREAM_URL; default {DEFAULT_HSTREAM_URL})",
    )
    add_hstream_ca_argument(parent)
    parent.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long to wait for the server on each call (default 10)",
    )
    parent.add_argument(
        "--format", choices=("text", "json"), default="text", help="output format (default: text)"
    )
    return parent


def add_stream_commands(commands: Any) -> None:
    """Adds the client commands to ``diffstore streams``."""
    parents = [hstream_options()]

    def command(name: str, help: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = commands.add_parser(
            name, help=help, description=help[:1].upper() + help[1:] + ".", parents=parents
        )
        return parser

    parser = command("create", "create a stream")
    parser.add_argument("name", metavar="NAME")
    parser.add_argument(
        "--shards", type=shell.positive_int, default=1, metavar="N", help="shards (default 1)"
    )
    parser.set_defaults(func=create)
    parser = command("ls", "list the streams")
    parser.add_argument(
        "--no-headers", action="store_true", help="print the rows without the header row (for scripts)"
    )
    parser.set_defaults(func=ls)
    parser = command("rm", "remove a stream and its records")
    parser.add_argument("name", metavar="NAME")
    parser.add_argument("--force", action="store_true", help="also when subscriptions still read it")
    parser.set_defaults(func=rm)
    parser = command(
        "split",
        "add a shard by splitting one shard's hash range in two (diffstore's streams server only)",
    )
    parser.add_argument("stream", metavar="STREAM")
    parser.add_argument(
        "--shard",
        type=int,
        metavar="ID",
        help="the shard whose hash range is split (default: the one with the widest range)",
    )
    parser.set_defaults(func=split)
    parser = command("subscribe", "create a subscription that reads a stream from its first record")
    parser.add_argument("stream", metavar="STREAM")
    parser.add_argument("--subscription", required=True, metavar="S", help="the subscription's name")
    parser.set_defaults(func=subscribe)
    parser = command("produce", "append one record per line of stdin to a stream")
    parser.add_argument("stream", metavar="STREAM")
    parser.add_argument(
        "--key", default="", metavar="K", help="partition key of every record (picks the shard)"
    )
    parser.set_defaults(func=produce)
    parser = command("consume", "print (and acknowledge) the records of a subscription")
    parser.add_argument("subscription", metavar="S")
    parser.add_argument("--count", type=shell.positive_int, metavar="N", help="stop after N records")
    parser.add_argument(
        "--idle", type=float, metavar="SECONDS", help="stop when no record came for SECONDS (default: never)"
    )
    parser.set_defaults(func=consume)


@contextlib.contextmanager
def stream_errors(url: str) -> Iterator[None]:
    """Turns stream failures into diffstore errors whose message says what to do (one place)."""
    # grpc (the 'streams' extra) is imported when a command runs, not when the parsers are built
    from diffstore.streams.client import (
        StreamAlreadyExists,
        StreamError,
        StreamInvalidArgument,
        StreamNotFound,
        StreamPreconditionFailed,
        StreamUnavailable,
    )

    try:
        yield
    except StreamUnavailable as exc:
        raise StorageError(
            f"cannot reach an HStream server at {url} ({exc}): start one with 'diffstore streams serve' "
            "or point --hstream / HSTREAM_URL at it"
        ) from exc
    except StreamNotFound as exc:
        raise NotFound(str(exc)) from exc
    except (StreamAlreadyExists, StreamPreconditionFailed) as exc:
        raise Conflict(str(exc)) from exc
    except StreamInvalidArgument as exc:
        raise BadRequest(str(exc)) from exc
    except StreamError as exc:
        raise DiffstoreError(f"{exc} ({exc.code})") from exc


@contextlib.contextmanager
def connected(args: argparse.Namespace) -> Iterator[StreamClient]:
    from diffstore.streams.client import StreamClient, StreamClientConfig, StreamUrl

    try:
        StreamUrl.parse(args.hstream)
    except ValueError as exc:
        raise InvalidRequest(f"--hstream {args.hstream}: {exc}") from None
    if args.timeout <= 0:
        raise InvalidRequest(f"--timeout {args.timeout}: must be above 0")
    roots = hstream_roots(getattr(args, "hstream_ca_file", None))
    config = StreamClientConfig(args.hstream, timeout_s=args.timeout, root_certificates=roots)
    with stream_errors(args.hstream), StreamClient(config) as client:
        client.check_reachable(min(CONNECT_TIMEOUT_S, args.timeout))
        yield client


def _emit(args: argparse.Namespace, obj: dict[str, Any], text: str) -> None:
    if args.format == "json":
        sys.stdout.write(orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE).decode())
    else:
        sys.stdout.write(text + "\n")
    sys.stdout.flush()


def create(args: argparse.Namespace) -> int:
    with connected(args) as client:
        client.create_stream(args.name, shard_count=args.shards)
    _emit(
        args,
        {"created": args.name, "shards": args.shards},
        f"created stream {args.name} ({args.shards} shard{'s' if args.shards > 1 else ''})",
    )
    return 0


def ls(args: argparse.Namespace) -> int:
    """One line per stream: ``NAME<TAB>SHARDS``, after a header row (text, unless ``--no-headers``)."""
    with connected(args) as client:
        streams = client.list_streams()
    if streams and args.format != "json" and not args.no_headers:
        sys.stdout.write("NAME\tSHARDS\n")
    for stream in sorted(streams, key=lambda s: s.streamName):
        _emit(
            args,
            {"name": stream.streamName, "shards": stream.shardCount},
            f"{stream.streamName}\t{stream.shardCount}",
        )
    return 0


def rm(args: argparse.Namespace) -> int:
    with connected(args) as client:
        client.delete_stream(args.name, force=args.force)
    _emit(args, {"removed": args.name}, f"removed stream {args.name}")
    return 0


def split(args: argparse.Namespace) -> int:
    """One line per shard after the split: ``SHARD<TAB>START_HASH<TAB>END_HASH`` (hash ranges in hex)."""
    with connected(args) as client:
        shard = args.shard
        if shard is None:
            widest = max(client.list_shards(args.stream), key=lambda s: s.end_hash - s.start_hash)
            shard = widest.shard_id
        shards = client.split_shard(args.stream, shard)
    for shard in sorted(shards, key=lambda s: s.start_hash):
        _emit(
            args,
            {
                "shard": shard.shard_id,
                "startHash": f"{shard.start_hash:032x}",
                "endHash": f"{shard.end_hash:032x}",
            },
            f"{shard.shard_id}\t{shard.start_hash:032x}\t{shard.end_hash:032x}",
        )
    return 0


def subscribe(args: argparse.Namespace) -> int:
    with connected(args) as client:
        client.create_subscription(args.subscription, args.stream)
    _emit(
        args,
        {"subscription": args.subscription, "stream": args.stream},
        f"created subscription {args.subscription} on stream {args.stream}",
    )
    return 0


def produce(args: argparse.Namespace) -> int:
    """Appends each line of stdin (without its line break) as one raw record; prints how many."""
    from diffstore.streams.client import StreamError
    from diffstore.streams.producer import BufferedProducer, ProducerError

    count = 0
    with connected(args) as client:
        client.get_stream(args.stream)  # a missing stream or a server that is down fails before stdin is read
        producer = BufferedProducer(client, args.stream)
        try:
            for line in sys.stdin.buffer:
                producer.append(line.rstrip(b"\r\n"), key=args.key)
                count += 1
            producer.flush()
        except ProducerError as exc:
            first = exc.errors[0] if getattr(exc, "errors", None) else exc
            if isinstance(first, StreamError):
                raise first from exc
            raise StorageError(f"appending to {args.stream} failed: {first}") from exc
        finally:
            with contextlib.suppress(Exception):  # the failure above is the one to report
                producer.close()
    produced = f"produced {shell.counted(count, 'record')} to {args.stream}"
    _emit(args, {"stream": args.stream, "records": count}, produced)
    return 0


def consume(args: argparse.Namespace) -> int:
    """One line per record, acknowledged once printed: ``KEY<TAB>PAYLOAD`` (text) or a JSON object."""
    from diffstore.streams.subscriber import StreamSubscriber

    printed = 0
    with connected(args) as client:
        client.get_subscription(args.subscription)  # a missing subscription fails here, not in a retry loop
        consumer = StreamSubscriber(client, args.subscription)
        try:
            last = time.monotonic()
            while args.count is None or printed < args.count:
                batch = consumer.poll(timeout=0.2)
                if batch is None:
                    if args.idle is not None and time.monotonic() - last >= args.idle:
                        break
                    continue
                last = time.monotonic()
                taken = batch.records[: None if args.count is None else args.count - printed]
                for record in taken:
                    # a JSON record (a protobuf Struct on the wire) is shown as its JSON text
                    payload: Any = record.json() if record.is_json else shell.show(record.payload)
                    text = orjson.dumps(payload).decode() if record.is_json else payload
                    obj = {
                        "key": record.partition_key,
                        "payload": payload,
                        "recordId": list(record.record_id),
                    }
                    _emit(args, obj, f"{record.partition_key}\t{text}")
                printed += len(taken)
                consumer.ack(r.record_id for r in taken)
        except KeyboardInterrupt:
            pass
        finally:
            consumer.close()
    return 0
