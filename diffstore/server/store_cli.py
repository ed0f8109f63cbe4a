"""``diffstore backup``, ``check``, ``migrate`` and ``compact``: whole-store tools over a data directory
(or, for a backup, a running server). The work is in the engine (``engine/backup.py``, ``check.py``,
``digests.py``, ``compact.py``); this module parses, shows progress on a terminal and prints the outcome.
Failures are one line on stderr
(``diffstore.cli``) and a non-zero exit.

``diffstore backup`` tells the two kinds of store apart by itself: the data directory of ``diffstore serve``
or of ``diffstore streams serve`` (the stream server's) is backed up the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from diffstore import tls
from diffstore.errors import InvalidRequest, StorageError, Unauthorized, error_from_code
from diffstore.guides import guide
from diffstore.shell import counted, quote_empty, show

_CHUNK = 1 << 20
# what GET /backup answers with (server/routes/backup.py, not imported: it pulls in FastAPI)
BACKUP_FORMAT_HEADER = "x-diffstore-backup"
BACKUP_FORMAT = "lmdb-compact"
EXPECTED_BYTES_HEADER = "x-diffstore-backup-expected-bytes"


def add_commands(subparsers: Any) -> None:
    """Registers ``backup``, ``check``, ``migrate`` and ``compact`` on the ``diffstore`` command."""
    parser = subparsers.add_parser(
        "backup",
        help="copy one consistent committed state of a store into a new directory",
        description="Copies one consistent committed state of a store into OUT, a new (or empty) directory "
        "that 'diffstore serve --data OUT' opens as it is. From the data directory (--data, beside the "
        "processes that write it; a stream server's directory too) or from a running server (--url).",
        epilog="Open generations are left out (manual collections: as if aborted; automatic ones: kept "
        "open, empty), and so are phantoms. A backup cut off midway leaves OUT marked unfinished: serve and "
        f"check refuse it. See {guide('backups.md')}",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", metavar="DIR", help="the data directory of the store to back up")
    source.add_argument("--url", metavar="URL", help="the base URL of a running diffstore server")
    tls.add_client_token_arguments(
        parser, "with --url: bearer token of a server started with --token (env DIFFSTORE_TOKEN)"
    )
    tls.add_client_arguments(parser)
    parser.add_argument(
        "--disk-share",
        type=_share,
        default=None,
        metavar="SHARE",
        help="with --data: the share of the store's commit rate the copy may take while writers commit;"
        " it measures their rate with and without it and paces itself (default 0.3; 1: full speed)",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="then re-read what was written: every file against its SHA-256 in OUT/MANIFEST.json, and every"
        " collection's digest; exit 1 if anything differs",
    )
    parser.add_argument("out", metavar="OUT", help="the directory to write (must not exist, or be empty)")
    parser.set_defaults(func=_backup)

    parser = subparsers.add_parser(
        "check",
        help="verify every invariant of a store's layout, or that a replica holds what its primary holds",
        description="With --data: verifies every invariant of a diffstore store's layout in one read "
        "transaction (on a live store, beside its writers, or on a backup), each generation's digest "
        "re-derived from its records included: one line per problem, then a summary. With --url REPLICA "
        "--against PRIMARY: compares the digest of every collection at every generation both servers hold "
        "and names, per collection, the oldest generation that differs.",
        epilog="Exit 0 only when every invariant holds (every compared digest is equal), 1 otherwise. "
        f"See {guide('backups.md')} and {guide('replicas.md')}",
    )
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--data", metavar="DIR", help="the data directory to check")
    target.add_argument("--url", metavar="URL", help="with --against: the base URL of the replica to compare")
    parser.add_argument("--against", metavar="URL", help="with --url: the base URL of its primary")
    tls.add_client_token_arguments(
        parser, "with --url: bearer token of servers started with --token (env DIFFSTORE_TOKEN)"
    )
    tls.add_client_arguments(parser)
    parser.set_defaults(func=_check)

    parser = subparsers.add_parser(
        "migrate",
        help="bring a store written by an older diffstore up to date (layout, digests, checksums)",
        description="Opens the store (which upgrades an older storage layout) and computes what a store "
        "written by an older diffstore lacks: the digest of every committed generation that its records can "
        "still prove (at or above each collection's GC horizon), and the checksum of every record written "
        "before records carried one. Each collection (and each batch of records) in its own write "
        "transaction, beside a running server.",
        epilog=f"Safe to run again: it only adds what is missing. See {guide('backups.md')}",
    )
    parser.add_argument("--data", metavar="DIR", required=True, help="the data directory to migrate")
    parser.set_defaults(func=_migrate)

    parser = subparsers.add_parser(
        "compact",
        help="give a store's free pages back to the disk",
        description="Rewrites a store's data file with its live pages only (LMDB's compacting copy, swapped "
        "in atomically: a crash leaves the old store or the new one) and reports the sizes before and after. "
        "Records written before records carried a checksum get theirs first. "
        "No other process may have the store open: it refuses while one has.",
        epilog="/metrics (diffstore_store_free_pages) and /overview tell when compacting is worth it. "
        f"See {guide('backups.md')}",
    )
    parser.add_argument("--data", metavar="DIR", required=True, help="the data directory to compact")
    parser.set_defaults(func=_compact)


def _share(text: str) -> float:
    share = float(text)
    if not 0 < share <= 1:
        raise argparse.ArgumentTypeError("a share is a number in (0, 1]")
    return share


def _backup(args: argparse.Namespace) -> int:
    from diffstore.engine import backup, copying

    out = Path(args.out)
    with _progress("backing up") as progress:
        if args.data is not None:
            share = copying.DISK_SHARE if args.disk_share is None else args.disk_share
            result = backup.backup_directory(Path(args.data), out, progress, share)
        elif args.disk_share is not None:
            raise InvalidRequest("--disk-share paces a copy from the data directory: use it with --data")
        else:
            result = _backup_from_server(args.url, args.token, out, progress, tls.client_tls_from_args(args))
    left_out = (
        f"{counted(result.open_generations_left_out, 'open generation')} of manual collections (as if"
        f" aborted), the records of {counted(result.open_generations_emptied, 'open automatic generation')},"
        f" {counted(result.phantoms_left_out, 'phantom record')}"
    )
    print(
        f"backed up a {result.kind.value} into {out}: {counted(result.bytes, 'byte', grouped=True)},"
        f" {counted(result.collections, 'collection')}; left out: {left_out}"
    )
    if args.verify:
        from diffstore.engine import manifest

        with _status(f"verifying {out}"):
            proof = manifest.verify(out)
        for line in (*proof.problems, *proof.notes):
            print(line)
        if not proof.ok:
            print(f"{out}: the backup is not what was written ({counted(len(proof.problems), 'problem')})")
            return 1
        print(f"verified {out}: every file and digest is the one written")
    return 0


def _check(args: argparse.Namespace) -> int:
    from diffstore.engine import check

    if args.url is not None or args.against is not None:
        return _check_against(args)
    with _progress(f"checking {args.data}", "rows") as progress:
        report = check.check_directory(Path(args.data), lambda problem: print(problem, flush=True), progress)
    for note in report.notes:
        print(f"note: {note}")
    rows = sum(report.rows.values())
    scanned = f"{counted(rows, 'row', grouped=True)} in {counted(len(report.rows), 'table')}"
    if report.ok:
        print(f"{args.data}: every invariant holds ({scanned})")
        return 0
    print(f"{args.data}: {counted(len(report.problems), 'problem')} ({scanned})")
    return 1


def _check_against(args: argparse.Namespace) -> int:
    from diffstore.client import digest_check
    from diffstore.client._sync import Client

    if args.url is None or args.against is None:
        raise InvalidRequest("check compares two servers with --url REPLICA --against PRIMARY: give both")
    differ = 0
    with (
        Client(args.url, token=args.token or None, **tls.client_kwargs(args)) as replica,
        Client(args.against, token=args.token or None, **tls.client_kwargs(args)) as primary,
    ):
        for found in digest_check.compare(replica, primary):
            line = _comparison_line(found)
            differ += found.first_difference is not None or found.missing is not None
            print(line, flush=True)
    if differ:
        print(f"{args.url} differs from {args.against} in {counted(differ, 'collection')}")
        return 1
    print(f"{args.url} holds what {args.against} holds at every generation both hold")
    return 0


def _comparison_line(found: Any) -> str:
    if found.missing is not None:
        return f"{found.name}: the {found.missing} has no such collection"
    counts = (
        f"{counted(found.compared, 'generation')} compared, {found.unknown} unknown,"
        f" {found.only_primary} only on the primary, {found.only_replica} only on the replica"
    )
    if found.first_difference is None:
        return f"{found.name}: equal ({counts})"
    mine, theirs = found.first_difference
    return (
        f"{found.name}: DIFFERS first at generation {quote_empty(show(mine.generation_id))}: replica"
        f" {mine.records} records {mine.hex}, primary {theirs.records} records {theirs.hex} ({counts})"
    )


def _migrate(args: argparse.Namespace) -> int:
    from diffstore.engine import digests, migrate
    from diffstore.engine.store import Store
    from diffstore.engine.types import StoreConfig

    with (
        _status(f"migrating {args.data}"),
        Store.open(Path(args.data), StoreConfig(background=False)) as store,
    ):
        filled = digests.fill_all(store.env, store.tables)
        sealed = migrate.seal_records(store.env, store.tables)
    total = sum(filled.values())
    where = ", ".join(f"{name} {count}" for name, count in sorted(filled.items()))
    print(
        f"migrated {args.data}: {counted(total, 'digest')} computed"
        + (f" ({where})" if where else "")
        + f", {counted(sealed, 'record')} given a checksum"
    )
    return 0


def _compact(args: argparse.Namespace) -> int:
    from diffstore.engine import compact

    with _progress("compacting") as progress:
        result = compact.compact(Path(args.data), progress)
    saved = result.before_bytes - result.after_bytes
    print(
        f"compacted the {result.kind.value} in {args.data}: {result.before_bytes:,} -> "
        f"{counted(result.after_bytes, 'byte', grouped=True)}"
        f" ({counted(saved, 'byte', grouped=True)} given back)"
        + (f"; {counted(result.sealed, 'record')} given a checksum" if result.sealed else "")
    )
    return 0


def _backup_from_server(
    url: str,
    token: str | None,
    out: Path,
    progress: Callable[[int, int], None] | None,
    files: tls.ClientTls | None = None,
) -> Any:
    import httpx

    from diffstore.engine import backup

    backup.check_target(out)
    headers = {"authorization": f"Bearer {token}"} if token else {}
    files = files or tls.ClientTls.resolve(None, None, os.environ)
    verify: Any = files.context() if url.startswith("https://") else True
    try:
        with (
            httpx.Client(base_url=url, headers=headers, timeout=httpx.Timeout(60.0), verify=verify) as http,
            http.stream("GET", "/backup") as response,
        ):
            _require_backup_answer(url, response)
            expected = int(response.headers.get(EXPECTED_BYTES_HEADER, "0") or 0)
            try:
                return backup.receive(response.iter_bytes(_CHUNK), out, expected, progress)
            except httpx.HTTPError as exc:
                # not chained: diffstore.cli reads a StorageError caused by httpx as "cannot reach the
                # server", while this one was reached and broke off midway, leaving OUT to delete
                raise StorageError(
                    f"the backup stream from {url} broke off ({type(exc).__name__}: {exc}); {out} is left"
                    " marked unfinished: delete it and take the backup again"
                ) from None
    except httpx.HTTPError as exc:  # the server cannot be reached: diffstore.cli says so in one line
        explained = tls.explain(url.rstrip("/"), exc)
        if explained is not None:
            raise StorageError(explained) from None
        raise StorageError(str(exc) or type(exc).__name__) from exc


def _require_backup_answer(url: str, response: Any) -> None:
    if response.status_code == 200 and response.headers.get(BACKUP_FORMAT_HEADER) == BACKUP_FORMAT:
        return
    response.read()
    code = None
    with contextlib.suppress(ValueError, AttributeError):
        body = response.json()
        code, reason = body.get("error"), body.get("reason")
    if response.status_code == 401 and code:
        raise Unauthorized(reason)
    if code and response.status_code != 404:
        raise error_from_code(code, f"GET /backup: {reason}")
    raise InvalidRequest(
        f"{url} is not a diffstore server that serves backups (GET /backup answered {response.status_code})"
    )


@contextlib.contextmanager
def _status(what: str) -> Iterator[None]:
    """A spinner on a terminal (stderr) while work of unknown length runs."""
    if not sys.stderr.isatty():
        yield
        return
    from rich.console import Console

    with Console(stderr=True).status(what):
        yield


@contextlib.contextmanager
def _progress(what: str, unit: str = "bytes") -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar of bytes (or of rows: ``unit="rows"``) on a terminal (stderr); None elsewhere
    (scripts, tests)."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns = (
        (DownloadColumn(), TransferSpeedColumn())
        if unit == "bytes"
        else (MofNCompleteColumn(), TextColumn(unit), TimeRemainingColumn())
    )
    with Progress(
        TextColumn(what),
        BarColumn(),
        *columns,
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task(what, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update
