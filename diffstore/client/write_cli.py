"""The write commands of ``diffstore``: ``put``, ``delete`` and ``generation start|commit|abort``.

A non-manual (``--auto``) collection commits each write on its own: ``put``/``delete`` without
``--generation`` wait until the write is committed, so the generation they print can be read at once. A
manual collection is written by its writer: ``generation start C G``, then ``put``/``delete`` with
``--generation G`` (``@open`` names the open one), then ``generation commit C`` (or ``abort``), which
default to the open generation. Keys, values and generation ids take the one text form of
:mod:`diffstore.shell` (printable UTF-8 as is, else ``base64:...``); ``--generation`` takes a ref too.

Failures are :class:`~diffstore.errors.DiffstoreError` (``diffstore.cli.main`` prints one line): a refused
write changes nothing (the server's answer, e.g. ``generationMismatch`` when G is not the open one).
"""

from __future__ import annotations

import argparse
from typing import Any

from diffstore import shell
from diffstore.client.commands import (
    add_command,
    emit,
    resolve_generation,
    resolve_given,
    wait_for_commit,
    writer_of,
)
from diffstore.collection import Collection
from diffstore.engine.types import PutResult
from diffstore.errors import NotAutomatic


def add_commands(subparsers: Any) -> None:
    """Registers ``put``, ``delete`` and ``generation`` on the ``diffstore`` command."""
    parser = add_command(subparsers, "put", "store a value under a key")
    parser.add_argument("collection", metavar="COLLECTION")
    parser.add_argument("key", metavar="KEY")
    parser.add_argument("value", metavar="VALUE")
    _generation_option(parser)
    parser.set_defaults(func=put)

    parser = add_command(subparsers, "delete", "delete a key (write its tombstone)")
    parser.add_argument("collection", metavar="COLLECTION")
    parser.add_argument("key", metavar="KEY")
    _generation_option(parser)
    parser.set_defaults(func=delete)

    generation = subparsers.add_parser(
        "generation",
        help="start, commit or abort a generation of a manual collection",
        description="The generation lifecycle of a manual collection: start G, write with --generation G, "
        "then commit (or abort) it.",
    )
    actions = generation.add_subparsers(dest="action", metavar="ACTION", required=True)
    parser = add_command(actions, "start", "open generation G of a manual collection")
    parser.add_argument("collection", metavar="COLLECTION")
    parser.add_argument(
        "generation",
        metavar="G",
        nargs="?",
        help="the new generation's id, above the current one (default: the current id counted on by one, "
        "of the same length: g1 after g0, 8 bytes ending in 01 after the empty start; past an open one, so "
        "that is refused unless --abort-outdated)",
    )
    parser.add_argument(
        "--abort-outdated",
        action="store_true",
        help="abort another open generation (its writes are lost) instead of refusing",
    )
    parser.set_defaults(func=generation_start)
    parser = add_command(actions, "commit", "commit the open generation: its writes become the current data")
    parser.add_argument("collection", metavar="COLLECTION")
    parser.add_argument("generation", metavar="G", nargs="?", help="the open generation (default: it)")
    parser.add_argument(
        "--metadata",
        metavar="KEY=VALUE",
        action="append",
        type=_pair,
        default=[],
        help="kept with the commit, listed by 'diffstore log' (repeat it; at most 4 KiB in all)",
    )
    parser.set_defaults(func=generation_commit)
    parser = add_command(actions, "abort", "abort the open generation: its writes are dropped")
    parser.add_argument("collection", metavar="COLLECTION")
    parser.add_argument("generation", metavar="G", nargs="?", help="the open generation (default: it)")
    parser.set_defaults(func=generation_abort)


def _generation_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--generation",
        metavar="G",
        help="the open generation of a manual collection to write into (@open names it); an automatic "
        "collection's write needs none: it commits on its own",
    )


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


# --- writes ----------------------------------------------------------------------------------------


def put(args: argparse.Namespace) -> int:
    key, value = shell.parse(args.key, "KEY"), shell.parse(args.value, "VALUE")
    return _write(args, key, value, "put")


def delete(args: argparse.Namespace) -> int:
    return _write(args, shell.parse(args.key, "KEY"), None, "deleted")


def _write(args: argparse.Namespace, key: bytes, value: bytes | None, done: str) -> int:
    with writer_of(args) as store:
        collection = store.collection(args.collection)
        at = resolve_generation(collection, args.generation, "--generation")
        if at is None and collection.manual:
            raise NotAutomatic(
                f"collection {args.collection} is manual: write into its open generation with --generation "
                f"G (after 'diffstore generation start {args.collection} G'), or create one with --auto"
            )
        result = collection.put(key, value, generation_id=at)
        if at is None:
            wait_for_commit(store, args.collection, result.generation_id)
    _report(args, key, result, done, at is not None)
    return 0


def _report(args: argparse.Namespace, key: bytes, result: PutResult, done: str, open_one: bool) -> None:
    generation = shell.quote_empty(shell.show(result.generation_id))
    pending = f"; visible once 'diffstore generation commit {args.collection}' commits it" if open_one else ""
    emit(
        args,
        {"key": shell.show(key), "generationId": shell.show(result.generation_id), "committed": not open_one},
        f"{done} {shell.show(key)} in {args.collection} (generation {generation}{pending})",
    )


# --- the generation lifecycle ----------------------------------------------------------------------


def next_generation_id(current: bytes) -> bytes:
    """The smallest id of ``current``'s length above it (one more, read as a big-endian number), so that a
    writer without its own numbering counts on from the current generation; after the empty start (or
    an id of all 0xff bytes, which no id of its length is above) it grows: 8 bytes ending in 01, or
    ``current`` followed by 00."""
    if not current:
        return (1).to_bytes(8, "big")
    following = int.from_bytes(current, "big") + 1
    if following >> (8 * len(current)):
        return current + b"\x00"
    return following.to_bytes(len(current), "big")


def generation_start(args: argparse.Namespace) -> int:
    with writer_of(args) as store:
        collection = store.collection(args.collection)
        if args.generation is None:
            current, open_id = collection.generation_state()
            # past an open generation too: starting it again would quietly join another writer's generation
            generation_id = next_generation_id(max(current, open_id or b""))
        else:
            generation_id = shell.parse(args.generation, "G")
        collection.start_generation(generation_id, abort_outdated=args.abort_outdated)
    shown = shell.quote_empty(shell.show(generation_id))
    emit(
        args,
        {"collection": args.collection, "started": shell.show(generation_id)},
        f"started generation {shown} of {args.collection}",
    )
    return 0


def generation_commit(args: argparse.Namespace) -> int:
    metadata = dict(args.metadata) or None
    with writer_of(args) as store:
        collection = store.collection(args.collection)
        generation_id = _open_one(collection, args.generation)
        collection.commit_generation(generation_id, metadata=metadata)
    shown = shell.quote_empty(shell.show(generation_id))
    emit(
        args,
        {"collection": args.collection, "committed": shell.show(generation_id), "metadata": metadata},
        f"committed generation {shown} of {args.collection}",
    )
    return 0


def generation_abort(args: argparse.Namespace) -> int:
    with writer_of(args) as store:
        collection = store.collection(args.collection)
        generation_id = _open_one(collection, args.generation)
        collection.abort_generation(generation_id)
    shown = shell.quote_empty(shell.show(generation_id))
    emit(
        args,
        {"collection": args.collection, "aborted": shell.show(generation_id)},
        f"aborted generation {shown} of {args.collection}",
    )
    return 0


def _open_one(collection: Collection, text: str | None) -> bytes:
    """G as given (a ref too), or the open generation (none open: ``noSuchGeneration``)."""
    if text is None:
        return collection.resolve_ref("@open").generation_id
    return resolve_given(collection, text, "G")
