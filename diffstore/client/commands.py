"""The data commands of ``diffstore``, over the HTTP API or on a data directory (:mod:`backend`).

``collections ls|create|rm|show``, ``get``, ``query`` and ``diff`` (the writes are in :mod:`write_cli`,
the readers in :mod:`readers_cli`, ``collections retention`` in :mod:`retention_cli`). Each takes
``--url``/``DIFFSTORE_URL`` or ``--data DIR`` (the store opened in this process; the output is the same),
``--token``/``DIFFSTORE_TOKEN`` and ``--format text|json``. Keys, values and
generation ids are printed in the one text form of :mod:`diffstore.shell` (printable UTF-8 as is, else
``base64:...``), and every option taking one accepts that form back. ``--format json`` prints one JSON
object (one per line for ``query`` and ``diff``) with the same text forms as strings.

Failures are raised as :class:`~diffstore.errors.DiffstoreError`; ``diffstore.cli.main`` turns them into
one line on stderr and a non-zero exit code.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import orjson

from diffstore import shell, tls
from diffstore.client import _calls, backend, retention_cli
from diffstore.client._sync import Client
from diffstore.client.backend import Backend, open_backend
from diffstore.engine import refs
from diffstore.engine.types import DiffItem, DiffSpec, Record, ResolvedRef
from diffstore.errors import (
    BadRequest,
    DiffstoreError,
    Gone,
    InvalidRequest,
    NotFound,
    ReadOnlyReplica,
)
from diffstore.guides import guide

PROTOCOL_DOC = guide("protocol.md")


def server_options(data: bool = False) -> argparse.ArgumentParser:
    """The options of every command that talks to a server (an argparse parent parser); with ``data`` (a
    data command) ``--data DIR`` too, a data directory instead of a server (:mod:`backend`)."""
    parent = backend.options(data)
    # the wire's field names in the server's messages, as this command's flags name them (diffstore.cli)
    parent.set_defaults(wire_flags=WIRE_FLAGS)
    return parent


WIRE_FLAGS = {
    "fromGenerationId": "--from",
    "toGenerationId": "--to",
    "generationId": "--generation",
    "phantomId": "--phantom",
    "fromKey": "--from-key",
    "toKey": "--to-key",
    "depth": "--depth",
}
"""The request fields a server's message may name, and the flag that sets each from the shell."""


def output_options() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--format", choices=("text", "json"), default="text", help="output format (default: text)"
    )
    return parent


def add_no_headers(parser: argparse.ArgumentParser) -> None:
    """``--no-headers`` on a command that prints a table: its text output without the header row."""
    parser.add_argument(
        "--no-headers", action="store_true", help="print the rows without the header row (for scripts)"
    )


def emit_table(args: argparse.Namespace, header: str, rows: list[tuple[dict[str, Any], str]]) -> None:
    """``rows`` as :func:`emit_all` prints them, led in text by the ``header`` row (tab-separated column
    names, as the rows' columns), unless ``--no-headers`` or there is no row."""
    if rows and args.format != "json" and not getattr(args, "no_headers", False):
        sys.stdout.write(header + "\n")
    emit_all(args, rows)


REFS_HELP = (
    "An option taking a generation also takes a ref: @current, @open, ~N (N commits before the current "
    "one), @reader:NAME or @reader:OWNER/NAME (a reader's position), or @ and an ISO time "
    "(@2026-11-25T10:00:00Z: the newest generation committed by then)."
)

_EPILOG = (
    "Keys, values and generation ids are UTF-8 text when printable, else 'base64:' and their base64; "
    f"every option accepts that form back. {REFS_HELP} The protocol is described in {PROTOCOL_DOC}."
)


class _Resolving(Protocol):
    def resolve_ref(self, ref: str) -> ResolvedRef: ...


def resolve_generation(collection: _Resolving, text: str | None, what: str) -> bytes | None:
    """The generation ``text`` names for option ``what``: a ref (``@current``, ``~1``, ...) resolved by the
    server (``GET /collections/{c}/refs``, one grammar for every front), else a generation id's text form.

    Raises:
        BadRequest, NotFound, Gone: the server's refusal (an unknown ref or reader, a time before the first
            commit), its message led by ``what``.
    """
    return None if text is None else resolve_given(collection, text, what)


def resolve_given(collection: _Resolving, text: str, what: str) -> bytes:
    """:func:`resolve_generation` of a given ``text``."""
    if not refs.is_ref(text):
        return shell.parse(text, what)
    try:
        return collection.resolve_ref(text).generation_id
    except (BadRequest, NotFound, Gone) as exc:
        raise type(exc)(f"{what} {text}: {exc.reason}") from exc


def add_command(sub: Any, name: str, help: str) -> argparse.ArgumentParser:
    """A data command: the server and output options, ``help`` as its description, the text form epilog."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help,
        description=help[:1].upper() + help[1:] + ".",
        parents=[server_options(data=True), output_options()],
        epilog=_EPILOG,
    )
    return parser


def add_commands(subparsers: Any) -> None:
    """Registers the data commands on the ``diffstore`` command."""

    def command(sub: Any, name: str, help: str) -> argparse.ArgumentParser:
        return add_command(sub, name, help)

    collections = subparsers.add_parser(
        "collections", help="list, create, remove or show collections", description="Manage collections."
    )
    collections_sub = collections.add_subparsers(dest="action", metavar="ACTION", required=True)
    parser = command(collections_sub, "ls", "list the collections")
    parser.set_defaults(func=collections_ls)
    parser = command(collections_sub, "create", "create a collection (say which kind: --manual or --auto)")
    parser.add_argument("name", metavar="NAME")
    # No default: the Python API's (Store/Client.create_collection) is manual and the shell's used to be
    # automatic; asking keeps every front in agreement (the HTTP API requires isManual too).
    kind = parser.add_mutually_exclusive_group(required=True)
    kind.add_argument(
        "--manual",
        action="store_true",
        help="its writer starts and commits each generation (a pipeline's target: ingest, transform)",
    )
    kind.add_argument(
        "--auto",
        action="store_true",
        help="each write commits on its own, shortly after it (what 'diffstore put' writes to)",
    )
    retention_cli.add_policy_options(parser, "no policy, even where the server has a default one")
    parser.set_defaults(func=collections_create)
    parser = command(collections_sub, "rm", "remove a collection and all its data")
    parser.add_argument("name", metavar="NAME")
    parser.add_argument(
        "--yes", action="store_true", help="do not ask (needed when stdin is not a terminal: a script)"
    )
    parser.set_defaults(func=collections_rm)
    parser = command(collections_sub, "show", "show a collection's mode, generations and retention")
    parser.add_argument("name", metavar="NAME")
    add_no_headers(parser)
    parser.set_defaults(func=collections_show)
    retention_cli.add_command(collections_sub, command)

    parser = command(subparsers, "get", "print the value of a key")
    parser.add_argument("collection", metavar="COLLECTION")
    parser.add_argument("key", metavar="KEY")
    parser.add_argument("--generation", metavar="G", help="read as of this generation (default: current)")
    parser.add_argument("--phantom", metavar="P", help="read with this phantom's writes (a phantom id)")
    parser.set_defaults(func=get)

    parser = command(subparsers, "query", "print the records of a collection in key order")
    parser.add_argument("collection", metavar="COLLECTION")
    parser.add_argument("--from-key", metavar="K", help="first key (inclusive)")
    parser.add_argument("--to-key", metavar="K", help="last key (exclusive)")
    parser.add_argument("--limit", metavar="N", type=shell.positive_int, help="print at most N records")
    parser.add_argument("--generation", metavar="G", help="read as of this generation (default: current)")
    parser.add_argument(
        "--phantom",
        metavar="P",
        help="read with this phantom's writes (a phantom id, e.g. of transform --preview)",
    )
    parser.set_defaults(func=query)

    parser = command(subparsers, "diff", "print the keys that changed between two generations")
    parser.add_argument("collection", metavar="COLLECTION")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--from", dest="from_generation", metavar="G", help="changes after generation G")
    start.add_argument("--from-reader", metavar="R", help="changes after reader R's generation")
    parser.add_argument(
        "--to", dest="to_generation", metavar="G", help="up to generation G (default: current)"
    )
    parser.add_argument(
        "--stat",
        action="store_true",
        help="print only the counts of inserted, updated and deleted keys (the rows are not kept)",
    )
    parser.set_defaults(func=diff)


def client_of(args: argparse.Namespace) -> Client:
    return Client(args.url, token=args.token or None, **tls.client_kwargs(args))


@contextmanager
def writer_of(args: argparse.Namespace) -> Iterator[Backend]:
    """The store of a command that writes. On a read replica the write would answer
    ``readOnlyReplica`` whatever it names, so a lookup before it that finds nothing there (a collection
    the replica has not copied yet, a reader) fails as ``readOnlyReplica`` too, not ``noSuch...``."""
    with open_backend(args) as store:
        try:
            yield store
        except NotFound as exc:
            client = getattr(store, "client", None)
            if client is None or not _is_replica(client):
                raise
            raise ReadOnlyReplica(
                f"{args.url} is a read replica: send writes to its primary (or promote it)"
            ) from exc


def _is_replica(client: Client) -> bool:
    try:
        answer = client.execute(_calls.replication())
    except DiffstoreError:
        return False
    return isinstance(answer, dict) and answer.get("role") == "replica"


def _opt(text: str | None, what: str) -> bytes | None:
    return None if text is None else shell.parse(text, what)


def emit(args: argparse.Namespace, obj: dict[str, Any], text: str) -> None:
    if args.format == "json":
        sys.stdout.write(orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE).decode())
    else:
        sys.stdout.write(text + "\n")


def emit_all(args: argparse.Namespace, rows: Iterable[tuple[dict[str, Any], str]]) -> None:
    for obj, text in rows:
        emit(args, obj, text)
    sys.stdout.flush()


# --- collections -----------------------------------------------------------------------------------


def collections_ls(args: argparse.Namespace) -> int:
    with open_backend(args) as store:
        infos = store.collections()
    if args.format == "json":
        emit(args, {"collections": [{"name": i.name, "manual": i.manual} for i in infos]}, "")
    else:
        for info in infos:
            print(f"{info.name}\t{'manual' if info.manual else 'auto'}")
    return 0


def collections_create(args: argparse.Namespace) -> int:
    policy = retention_cli.policy_of(args)
    with open_backend(args, create=True) as store:
        store.create_collection(args.name, manual=args.manual, retention=policy)
    mode = "manual" if args.manual else "auto"
    emit(args, {"created": args.name, "manual": args.manual}, f"created collection {args.name} ({mode})")
    return 0


def collections_rm(args: argparse.Namespace) -> int:
    """Removes the collection once confirmed: ``--yes``, or ``y`` typed on a terminal; without a terminal
    and without ``--yes`` it refuses (a script must say so), and a missing collection fails first."""
    with writer_of(args) as store:
        if not args.yes:
            current = store.collection(args.name).generation_id  # noSuchCollection before any question
            confirm_removal(args.name, current)
        store.delete_collection(args.name)
    emit(args, {"removed": args.name}, f"removed collection {args.name}")
    return 0


def confirm_removal(name: str, generation_id: bytes | None) -> None:
    """Asks on the terminal; raises :class:`InvalidRequest` (nothing removed) unless the answer is yes."""
    if not sys.stdin.isatty():
        raise InvalidRequest(
            f"not removing collection {name}: stdin is not a terminal to confirm on; pass --yes to remove it"
        )
    current = shell.quote_empty(shell.show(generation_id or b""))
    prompt = (
        f"remove collection {name} (current generation {current}), its data, its readers and every reader "
        "of it? [y/N] "
    )
    try:
        answer = input(prompt)
    except EOFError:
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        raise InvalidRequest(
            f"not removing collection {name}: not confirmed (pass --yes to skip the question)"
        )


def collections_show(args: argparse.Namespace) -> int:
    with open_backend(args) as store:
        collection = store.collection(args.name)
        current, opened = collection.generation_state()
        manual = collection.manual
        policy = collection.retention()
    generation = shell.show_opt(current)
    next_generation = shell.show_opt(opened)
    obj = {
        "name": args.name,
        "manual": manual,
        "generationId": generation,
        "nextGenerationId": next_generation,
        "retention": retention_cli.policy_json(policy),
    }
    header = [] if getattr(args, "no_headers", False) else ["FIELD\tVALUE"]
    text = "\n".join(
        header
        + [
            f"name\t{args.name}",
            f"mode\t{'manual' if manual else 'auto'}",
            f"generation\t{generation if generation is not None else '-'}",
            f"next generation\t{next_generation if next_generation is not None else '-'}",
            f"retention\t{retention_cli.policy_text(policy)}",
        ]
    )
    emit(args, obj, text)
    return 0


# --- data ------------------------------------------------------------------------------------------


def get(args: argparse.Namespace) -> int:
    """Prints the value (text) or ``{"key","value","generationId"}`` (json); exit 1 when the key is absent."""
    key = shell.parse(args.key, "KEY")
    phantom = _opt(args.phantom, "--phantom")
    with open_backend(args) as store:
        collection = store.collection(args.collection)
        at = resolve_generation(collection, args.generation, "--generation")
        result = collection.get_result(key, at, phantom)
    value = None if result.record is None else shell.show(result.record.value)
    generation = shell.show(result.generation_id)
    if args.format == "json":
        emit(args, {"key": shell.show(key), "value": value, "generationId": generation}, "")
    elif value is not None:
        emit(args, {}, value)
    if value is None:
        print(
            f"diffstore get: no key {shell.show(key)} in {args.collection} at generation {generation}",
            file=sys.stderr,
        )
        return 1
    return 0


COMMIT_WAIT_S = backend.COMMIT_WAIT_S


def wait_for_commit(store: Backend, name: str, generation_id: bytes) -> None:
    """Returns once ``generation_id`` is committed, so that the id ``put`` prints can be read at once.

    A non-manual collection commits a write a short delay after it (``commit_delay_ms``).
    """
    store.wait_for_commit(name, generation_id)


def query(args: argparse.Namespace) -> int:
    """One line per record: ``KEY<TAB>VALUE`` (text) or ``{"key","value"}`` (json)."""
    with open_backend(args) as store:
        collection = store.collection(args.collection)
        records = collection.query(
            generation_id=resolve_generation(collection, args.generation, "--generation"),
            phantom_id=_opt(args.phantom, "--phantom"),
            from_key=_opt(args.from_key, "--from-key"),
            to_key=_opt(args.to_key, "--to-key"),
        )
        if args.limit:
            records = itertools.islice(records, args.limit)
        # printed as the pages arrive: a large collection is never held whole
        emit_all(args, (_record_line(record) for record in records))
    return 0


def _record_line(record: Record) -> tuple[dict[str, Any], str]:
    key, value = shell.show(record.key), shell.show(record.value)
    return {"key": key, "value": value}, f"{key}\t{value}"


def diff(args: argparse.Namespace) -> int:
    """One line per changed key: ``+ KEY<TAB>NEW``, ``- KEY<TAB>OLD`` or ``~ KEY<TAB>OLD<TAB>NEW``; with
    ``--stat`` one line of counts, ``N inserted, N updated, N deleted`` (json: ``{"inserted", "updated",
    "deleted"}``), counted as the pages arrive."""
    with open_backend(args) as store:
        collection = store.collection(args.collection)
        request = DiffSpec.of(
            from_generation_id=resolve_generation(collection, args.from_generation, "--from"),
            from_reader=args.from_reader,
            to_generation_id=resolve_generation(collection, args.to_generation, "--to"),
        )
        # each key once, from --from to --to, also over a range the server answers in several spans
        items = store.changes(collection, request)
        if args.stat:
            counts = diff_stat(items)
            text = ", ".join(f"{count} {kind}" for kind, count in counts.items())
            emit_all(args, [(dict(counts), text)])
            return 0
        emit_all(args, (_change_line(item) for item in items))  # as the pages arrive, never held whole
    return 0


def _change_line(item: DiffItem) -> tuple[dict[str, Any], str]:
    key = shell.show(item.key)
    old, new = shell.show_opt(item.from_value), shell.show_opt(item.to_value)
    return {"key": key, "fromValue": old, "toValue": new}, shell.change_line(key, old, new)


def diff_stat(items: Iterable[DiffItem]) -> dict[str, int]:
    """How many of ``items`` insert, update and delete a key: the lines ``diffstore diff`` prints."""
    counts = {"inserted": 0, "updated": 0, "deleted": 0}
    for item in items:
        if item.from_value is None:
            counts["inserted"] += 1
        elif item.to_value is None:
            counts["deleted"] += 1
        else:
            counts["updated"] += 1
    return counts
