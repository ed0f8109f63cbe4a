"""What ``diffstore transform`` tells its user about its rounds: a live line on a terminal, one line per round
otherwise.

On a terminal (text format) a spinner line shows the round under way: its number, its stage (planned →
reading diffs → computing and writing → committing), the rows read per source and written so far, and its
elapsed time; it is redrawn four times a second, so a long round is never silent. Each committed round then
leaves one line above it. Anywhere else (a pipe, a file, ``--log-format json``) nothing is redrawn: a round
is one line (text) or one ``round committed`` record (JSON), written when it commits; the stages are
DEBUG records in JSON. ``--watch`` is the same: one line per round, and ``caught up`` once.

No pyspark here: the runner's events (:class:`~diffstore.spark.transform.Transform`'s ``on_event``) are
plain names and dicts, so this module is tested without Spark.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from rich.markup import escape
from rich.spinner import Spinner

from diffstore import jobmetrics, logs, shell

_log = logging.getLogger("diffstore.transform")

STAGES = {
    "planned": "starting its generation",
    "started": "reading diffs",
    "read": "computing and writing",
    "written": "committing",
}
"""The stage a round is in after each event of the runner."""


def show_id(value: bytes | None) -> str:
    """A generation id in the command line's one text form (``null`` for none, ``""`` for the empty one)."""
    if value is None:
        return "null"
    return shell.show(value) or '""'


def show_ranges(ranges: Mapping[str, tuple[bytes | None, bytes]]) -> str:
    """``a X→Y, b X→Y``: what a round reads of each source."""
    return ", ".join(f"{alias} {show_id(f)}→{show_id(t)}" for alias, (f, t) in ranges.items())


def show_rows(rows: Mapping[str, int | None]) -> str:
    """``a 1,000, b 0`` (``?`` for a diff that was not counted)."""
    return ", ".join(f"{alias} {'?' if n is None else f'{n:,}'}" for alias, n in rows.items())


class TransformProgress:
    """Turns the runner's events into what the user sees (see the module doc) and into job metrics.

    Args:
        report: the command's reporter (rich text or JSON log records).
        sources: alias → collection, for the ``caught up; following …`` line.
        watch: the command follows its sources (``--watch``).
        metrics: the ``--metrics-port`` series, fed every event.
        live: draw the live line (a terminal, text format).
        clock: for the elapsed time (tests).
    """

    def __init__(
        self,
        report: logs.Reporter,
        sources: Mapping[str, str],
        watch: bool,
        metrics: jobmetrics.TransformMetrics | None = None,
        live: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.report, self.sources, self.watch, self.metrics = report, dict(sources), watch, metrics
        self.live, self.clock = live, clock
        self.spinner = Spinner("dots", text="starting")
        self.rounds = 0  # committed by this run
        self.number: int | None = None  # the round under way's number on the target
        self.stage: str | None = None  # None between rounds
        self.ranges = ""
        self.rows_read: dict[str, int | None] = {}
        self.rows_written: int | None = None
        self.started = clock()
        self._caught_up_told = False
        self._lock = threading.Lock()  # events come from the runner's thread, redraws from rich's

    # -- the live line --------------------------------------------------------------------------------------

    def render(self) -> Spinner:
        """The live line as it is now (rich's refresh thread asks four times a second)."""
        self.spinner.update(text=self.line())
        return self.spinner

    def line(self) -> str:
        """The round under way, or what the runner does between rounds (rich markup)."""
        with self._lock:
            if self.stage is None:
                if self._caught_up_told and self.watch:
                    return f"caught up; following {escape(', '.join(sorted(set(self.sources.values()))))}"
                return "checking the sources"
            parts = [f"[cyan]round {self.number or self.rounds + 1}[/]", self.stage]
            if self.rows_read:
                parts.append(f"read {show_rows(self.rows_read)}")
            if self.rows_written is not None:
                parts.append(f"wrote {self.rows_written:,}")
            parts.append(f"{self.clock() - self.started:.1f} s")
            return " · ".join(parts)

    # -- events ---------------------------------------------------------------------------------------------

    def on_event(self, name: str, details: dict[str, Any]) -> None:
        """The runner's ``on_event`` hook."""
        if self.metrics is not None:
            self.metrics.on_event(name, details)
        with self._lock:
            if name == "planned":
                self.stage, self.started = STAGES[name], self.clock()
                self.ranges = show_ranges(details["ranges"])
                self.rows_read, self.rows_written, self.number = {}, None, None
            elif name in STAGES and self.stage is not None:
                self.stage = STAGES[name]
                if name == "started":
                    self.number = details.get("round")
                elif name == "read":
                    self.rows_read = dict(details.get("rows_read", {}))
                elif name == "written":
                    self.rows_read = dict(details.get("rows_read", {}))
                    self.rows_written = details.get("rows_written")
        if name in STAGES:
            # the stages are the live line's; in a log they are DEBUG records, never a line per stage
            if self.report.json:
                fields = {k: v for k, v in details.items() if k != "ranges"}
                if name == "planned":
                    fields["ranges"] = self.ranges
                self.report.logger.debug(f"round {name}", extra=_loggable(fields))
            return
        handler = getattr(self, f"_on_{name}", None)
        if handler is not None:
            handler(details)

    def _on_committed(self, details: dict[str, Any]) -> None:
        stats = details["stats"]
        with self._lock:
            self.rounds += 1
            self.stage = None
        ranges = show_ranges(stats.ranges)
        self.report.say(
            logging.INFO,
            f"[green]committed[/] {show_id(stats.generation_id)} ({escape(ranges)}): "
            f"read {show_rows(stats.rows_read)}, wrote {_count(stats.rows_written)}, {stats.seconds:.1f} s",
            "round committed",
            generation=show_id(stats.generation_id),
            ranges=ranges,
            rows_read=stats.rows_read,
            rows_written=stats.rows_written,
            seconds=stats.seconds,
        )

    def _on_failed(self, details: dict[str, Any]) -> None:
        error = str(details["error"])
        with self._lock:
            self.stage = None
        self.report.say(
            logging.WARNING, f"[yellow]retry[/] {escape(error)}", "round failed, retrying", error=error
        )

    def _on_waiting(self, details: dict[str, Any]) -> None:
        self.report.say(
            logging.INFO,
            "[yellow]another runner holds the target; waiting for its commit[/]",
            "waiting for another runner's commit",
        )

    def _on_standby(self, details: dict[str, Any]) -> None:
        self.report.say(
            logging.INFO,
            "[yellow]standby[/]: another runner holds the target's lease",
            "standby",
            owner=details["owner"],
        )

    def _on_active(self, details: dict[str, Any]) -> None:
        self.report.say(
            logging.INFO,
            f"[green]active[/]: holding the target's lease (version {details['version']})",
            "active",
            owner=details["owner"],
            version=details["version"],
        )

    def _on_lease_lost(self, details: dict[str, Any]) -> None:
        reason = str(details["reason"])
        with self._lock:
            self.stage = None
        self.report.say(logging.WARNING, f"[yellow]lease lost[/] {reason}", "lease lost", reason=reason)

    def _on_caught_up(self, details: dict[str, Any]) -> None:
        # told once; with --watch, every wake-up catches up again: its rounds say "committed" already
        if self._caught_up_told:
            return
        rounds = details["rounds"]
        following = f"; following {', '.join(sorted(set(self.sources.values())))}" if self.watch else ""
        after = f" after {rounds} round{'' if rounds == 1 else 's'}" if rounds else ""
        self.report.say(
            logging.INFO, f"[green]caught up[/]{after}{escape(following)}", "caught up", rounds=rounds
        )
        with self._lock:
            self._caught_up_told = True


def _count(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def _loggable(fields: dict[str, Any]) -> dict[str, Any]:
    """Event details as JSON log fields: generation ids in their text form."""
    return {k: show_id(v) if isinstance(v, bytes) else v for k, v in fields.items()}
