"""``diffstore revert COLLECTION GENERATION [--generation OPEN]``: make a collection equal to an earlier
committed generation (SPEC §8, ``POST /collections/{c}/revert``).

The changes are written as one write: into the open generation ``--generation`` of a manual collection
(its writer commits it, or aborts it to undo the revert), or into the next generation of an automatic
one, which commits it shortly after; the command then waits for that commit, so the state it prints is
the one readers see. A manual collection needs ``--generation``: writing into a generation that some
other writer opened is never done by default.

Text output: ``reverted C to G: N keys changed in generation X``; ``--format json`` prints
``{"collection", "toGenerationId", "generationId", "changedKeys"}``. Generation ids use the one text form
of :mod:`diffstore.shell`; both take refs too (``diffstore revert C ~2 --generation @open``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from diffstore import shell, tls
from diffstore.client._sync import Client
from diffstore.client.commands import (
    REFS_HELP,
    output_options,
    resolve_generation,
    server_options,
    wait_for_commit,
)
from diffstore.errors import GenerationMismatch

_WIRE_FLAGS = {"toGenerationId": "GENERATION", "generationId": "--generation"}


def add_commands(subparsers: Any) -> None:
    """Registers ``revert`` on the ``diffstore`` command."""
    parser = subparsers.add_parser(
        "revert",
        help="make a collection equal to an earlier committed generation",
        description="Writes the changes that make COLLECTION equal to its state at the committed "
        "generation GENERATION: into the open generation named by --generation (a manual collection; "
        "its writer then commits or aborts it), or into the next generation of an automatic collection "
        "(committed shortly after: the command waits for it). Prints how many keys changed.",
        parents=[server_options(), output_options()],
        epilog="Generation ids are UTF-8 text when printable, else 'base64:' and their base64 (the form "
        f"'diffstore log' prints). {REFS_HELP} A generation below the readers' minimum was "
        "garbage-collected and cannot be restored (generationCollected).",
    )
    parser.add_argument("collection", metavar="COLLECTION")
    parser.add_argument(
        "to_generation", metavar="GENERATION", help="the committed generation to restore, or a ref such as ~1"
    )
    parser.add_argument(
        "--generation",
        metavar="OPEN",
        help="the open generation to write into, or @open (required for a manual collection)",
    )
    parser.set_defaults(func=run_revert, wire_flags=_WIRE_FLAGS)


def run_revert(args: argparse.Namespace) -> int:
    with Client(args.url, token=args.token or None, **tls.client_kwargs(args)) as client:
        collection = client.collection(args.collection)
        to_generation = resolve_generation(collection, args.to_generation, "GENERATION")
        assert to_generation is not None  # a positional argument: always given
        open_generation = resolve_generation(collection, args.generation, "--generation")
        if open_generation is None and collection.manual:
            opened = collection.next_generation_id
            raise GenerationMismatch(
                f"collection {args.collection} is manual: name the open generation to write into with "
                + (
                    f"--generation (generation {shell.show(opened)} is open)"
                    if opened is not None
                    else "--generation (none is open: its writer starts one)"
                )
            )
        result = collection.revert(to_generation, generation_id=open_generation)
        if open_generation is None and result.changed_keys:
            wait_for_commit(client, args.collection, result.generation_id)
    generation = shell.show(result.generation_id)
    if args.format == "json":
        body = {
            "collection": args.collection,
            "toGenerationId": shell.show(to_generation),
            "generationId": generation,
            "changedKeys": result.changed_keys,
        }
        sys.stdout.write(orjson.dumps(body, option=orjson.OPT_APPEND_NEWLINE).decode())
    else:
        keys = shell.counted(result.changed_keys, "key")
        sys.stdout.write(
            f"reverted {args.collection} to {shell.show(to_generation)}: {keys} changed in generation "
            f"{generation}"
            + ("" if open_generation is None else " (open: commit it to keep the revert)")
            + "\n"
        )
    sys.stdout.flush()
    return 0
