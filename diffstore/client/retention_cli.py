"""The retention options of ``collections create`` and the command ``collections retention NAME``.

A policy keeps history beyond what a collection's readers need (``docs/protocol.md``, "Retention"):
``--keep 7d`` keeps the generations committed in the last 7 days (and the one current when that window
began), ``--keep-generations 100`` the 100 newest; with both, a generation either keeps is kept.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from diffstore.engine.types import MAX_KEEP_GENERATIONS, MAX_KEEP_MS, RetentionPolicy
from diffstore.errors import InvalidRequest

_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w)")

RETENTION_HELP = (
    "A retention policy keeps history that moving a reader would otherwise let GC collect: --keep T keeps "
    "the generations committed in the last T (and the one current when that window began), "
    "--keep-generations N the N newest; with both, a generation either keeps is kept. Every version "
    "written in a kept generation stays on disk."
)


def duration_ms(text: str) -> int:
    """``7d``, ``12h``, ``30m``, ``45s``, ``500ms``, ``2w`` or sums of them (``1d12h``) in milliseconds."""
    compact = text.strip().lower()
    parts = _DURATION.findall(compact)
    if not compact or "".join(number + unit for number, unit in parts) != compact:
        raise argparse.ArgumentTypeError(
            f"not a duration: {text!r} (a number and a unit: ms, s, m, h, d or w; e.g. 7d, 12h, 1d12h)"
        )
    total = sum(int(number) * _UNITS_MS[unit] for number, unit in parts)
    if not 1 <= total <= MAX_KEEP_MS:
        raise argparse.ArgumentTypeError(f"the duration must be at least 1ms and at most {MAX_KEEP_MS}ms")
    return total


def generations(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_KEEP_GENERATIONS:
        raise argparse.ArgumentTypeError(f"expected a whole number of generations >= 1, not {text!r}")
    return value


def add_policy_options(parser: argparse.ArgumentParser, none_help: str) -> None:
    """``--keep T``, ``--keep-generations N`` and ``--no-retention`` on ``parser``."""
    group = parser.add_argument_group("retention", RETENTION_HELP)
    group.add_argument(
        "--keep", metavar="T", type=duration_ms, help="keep the generations committed in the last T (e.g. 7d)"
    )
    group.add_argument(
        "--keep-generations", metavar="N", type=generations, help="keep the N newest generations"
    )
    group.add_argument("--no-retention", action="store_true", help=none_help)


def policy_of(args: argparse.Namespace) -> RetentionPolicy | None:
    """The policy the options name: None when none is given, an empty policy for ``--no-retention``."""
    if args.no_retention:
        if args.keep is not None or args.keep_generations is not None:
            raise InvalidRequest("--no-retention goes alone (not with --keep or --keep-generations)")
        return RetentionPolicy()
    if args.keep is None and args.keep_generations is None:
        return None
    return RetentionPolicy(args.keep, args.keep_generations)


def show_duration(ms: int) -> str:
    """The shortest exact form: ``7d``, ``36h``, ``1500ms``."""
    for unit in ("w", "d", "h", "m", "s"):
        if ms % _UNITS_MS[unit] == 0:
            return f"{ms // _UNITS_MS[unit]}{unit}"
    return f"{ms}ms"


def policy_text(policy: RetentionPolicy | None) -> str:
    """``keep 7d, keep 100 generations`` or ``none``."""
    if policy is None or policy.empty:
        return "none (readers alone decide what GC collects)"
    parts = []
    if policy.keep_ms is not None:
        parts.append(f"keep {show_duration(policy.keep_ms)}")
    if policy.keep_generations is not None:
        count = policy.keep_generations
        parts.append(f"keep {count} generation{'' if count == 1 else 's'}")
    return ", ".join(parts)


def policy_json(policy: RetentionPolicy | None) -> dict[str, int]:
    found: dict[str, int] = {}
    if policy is not None and policy.keep_ms is not None:
        found["keepMs"] = policy.keep_ms
    if policy is not None and policy.keep_generations is not None:
        found["keepGenerations"] = policy.keep_generations
    return found


def add_command(collections_sub: Any, command: Any) -> None:
    """``collections retention NAME [--keep T] [--keep-generations N] [--no-retention]``."""
    parser = command(collections_sub, "retention", "show or change a collection's retention policy")
    parser.add_argument("name", metavar="NAME")
    add_policy_options(parser, "remove the policy (GC then collects all the readers let go)")
    parser.set_defaults(func=retention)


def retention(args: argparse.Namespace) -> int:
    """Shows the policy, or replaces it when an option is given (the options given make the new policy)."""
    from diffstore.client.commands import client_of, emit

    wanted = policy_of(args)
    with client_of(args) as client:
        collection = client.collection(args.name)
        policy = collection.retention() if wanted is None else collection.set_retention(wanted)
    verb = "" if wanted is None else "now "
    text = f"retention of {args.name}: {verb}{policy_text(policy)}"
    emit(args, {"name": args.name, "retention": policy_json(policy)}, text)
    return 0
