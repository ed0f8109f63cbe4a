"""``diffstore readers ls|create|move|rm``: a collection's readers, the named positions it keeps.

A reader is stored in an owner collection and points at a target (a collection, itself by default, or a
stream such as ``hstream://s``); its generation says how far the owner has read the target (``-``: from
the beginning). GC keeps what the readers of a collection have not read, so a reader that nobody moves
any more holds data forever: remove it with ``readers rm`` when its query is retired.

``--generation`` and ``move``'s G name a generation of the reader's target: its text form, or a ref
(``@current``, ``~1``, ...) resolved in the target collection.
"""

from __future__ import annotations

import argparse
from typing import Any

from diffstore import shell
from diffstore.client.backend import Backend, open_backend
from diffstore.client.commands import (
    REFS_HELP,
    add_command,
    add_no_headers,
    emit,
    emit_table,
    resolve_given,
    writer_of,
)
from diffstore.engine.types import UNSET, Expected, Reader
from diffstore.errors import NoSuchReader


def add_commands(subparsers: Any) -> None:
    """Registers ``readers`` on the ``diffstore`` command."""
    readers = subparsers.add_parser(
        "readers",
        help="list, create, move or remove the readers of a collection",
        description="Readers: named positions that a collection keeps in a target collection or stream.",
        epilog=REFS_HELP,
    )
    actions = readers.add_subparsers(dest="action", metavar="ACTION", required=True)
    parser = add_command(actions, "ls", "list the readers of a collection")
    parser.add_argument("collection", metavar="COLLECTION")
    add_no_headers(parser)
    parser.set_defaults(func=readers_ls)

    parser = add_command(actions, "create", "create a reader in a collection")
    parser.add_argument("collection", metavar="COLLECTION", help="the collection that keeps the reader")
    parser.add_argument("name", metavar="NAME")
    parser.add_argument(
        "--target", metavar="T", help="what it reads: a collection or a stream (default: COLLECTION itself)"
    )
    parser.add_argument(
        "--generation",
        metavar="G",
        help="where it starts, a generation of the target (default: the beginning)",
    )
    parser.set_defaults(func=readers_create)

    parser = add_command(actions, "move", "move a reader to generation G of its target")
    parser.add_argument("collection", metavar="COLLECTION")
    parser.add_argument("name", metavar="NAME")
    parser.add_argument("generation", metavar="G", help="a generation of the reader's target (a ref too)")
    parser.add_argument(
        "--expect",
        metavar="G",
        help="move only if the reader is at G now ('-' for the beginning), else badVersion and no move",
    )
    parser.set_defaults(func=readers_move)

    parser = add_command(actions, "rm", "remove a reader (GC may then collect what only it kept)")
    parser.add_argument("collection", metavar="COLLECTION")
    parser.add_argument("name", metavar="NAME")
    parser.set_defaults(func=readers_rm)


def readers_ls(args: argparse.Namespace) -> int:
    """One line per reader: ``NAME<TAB>TARGET<TAB>GENERATION`` (``-`` when the reader has none), after a
    header row (text, unless ``--no-headers``)."""
    with open_backend(args) as store:
        readers = store.collection(args.collection).readers()
    emit_table(args, "NAME\tTARGET\tGENERATION", [_line(reader) for reader in readers])
    return 0


def _line(reader: Reader) -> tuple[dict[str, Any], str]:
    generation = shell.show_opt(reader.generation_id)
    obj = {"name": reader.name, "collection": reader.collection, "generationId": generation}
    return obj, f"{reader.name}\t{reader.collection}\t{generation if generation is not None else '-'}"


def readers_create(args: argparse.Namespace) -> int:
    target = args.target or args.collection
    with writer_of(args) as store:
        at = _position(store, target, args.generation, "--generation")
        store.collection(args.collection).create_reader(args.name, collection=target, generation_id=at)
        reader = _reader(store, args.collection, args.name)
    obj, line = _line(reader)
    emit(args, obj, f"created reader {line}")
    return 0


def readers_move(args: argparse.Namespace) -> int:
    with writer_of(args) as store:
        reader = _reader(store, args.collection, args.name)
        at = _position(store, reader.collection, args.generation, "G")
        expected: Expected = UNSET
        if args.expect is not None:
            expected = _position(store, reader.collection, args.expect, "--expect")
        store.collection(args.collection).update_reader(args.name, at, expected)
        reader = _reader(store, args.collection, args.name)
    obj, line = _line(reader)
    emit(args, obj, f"moved reader {line}")
    return 0


def readers_rm(args: argparse.Namespace) -> int:
    with writer_of(args) as store:
        _reader(store, args.collection, args.name)  # a typo is an error, not a silent no-op
        store.collection(args.collection).delete_reader(args.name)
    emit(args, {"removed": args.name, "collection": args.collection}, f"removed reader {args.name}")
    return 0


def _reader(store: Backend, collection: str, name: str) -> Reader:
    for reader in store.collection(collection).readers():
        if reader.name == name:
            return reader
    raise NoSuchReader(f"collection {collection} has no reader {name}")


def _position(store: Backend, target: str, text: str | None, what: str) -> bytes | None:
    """A generation of ``target`` (``-``: the beginning); a ref only where the target is a collection."""
    if text is None or text == "-":
        return None
    return resolve_given(store.collection(target), text, what)
