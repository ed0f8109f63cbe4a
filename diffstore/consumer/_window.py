"""The consumer's window logic as a pure state machine: no I/O, no clock, no threads (h11 style).

:class:`WindowMachine` answers "what next" with an action (:class:`LoadCheckpoint`, :class:`ReadHeads`,
:class:`WaitForChange`, :class:`FetchPage`, :class:`Deliver`, :class:`WriteCheckpoint`) and is fed the
outcome of each one. The loop in :mod:`diffstore.consumer._loop` only performs actions, so every
ordering and rollback rule of the delivery guarantee (see :mod:`diffstore.consumer`) lives here and is
tested without a store.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from diffstore.engine.types import DiffItem, DiffPage
from diffstore.errors import InvalidRequest

Positions = Mapping[str, bytes]

# ------------------------------------------------------------------------------------ listener events


@dataclass(frozen=True, slots=True)
class StartWindow:
    from_positions: Positions


@dataclass(frozen=True, slots=True)
class StartSource:
    source: str


@dataclass(frozen=True, slots=True)
class DataEvent:
    source: str
    key: bytes
    old: bytes | None
    new: bytes | None


@dataclass(frozen=True, slots=True)
class EndSource:
    source: str


@dataclass(frozen=True, slots=True)
class EndWindow:
    to_positions: Positions


@dataclass(frozen=True, slots=True)
class Rollback:
    from_positions: Positions
    error: BaseException | None


Event = StartWindow | StartSource | DataEvent | EndSource | EndWindow | Rollback

# ------------------------------------------------------------------------------- actions for the loop


@dataclass(frozen=True, slots=True)
class LoadCheckpoint:
    """Read (creating when missing) the checkpoint readers; answer with ``checkpoint_loaded``."""


@dataclass(frozen=True, slots=True)
class ReadHeads:
    """Read every source's current generation; answer with ``heads_read``."""


@dataclass(frozen=True, slots=True)
class WaitForChange:
    """Caught up: wait until a source moves away from ``positions``; answer with ``wait_ended``."""

    positions: Positions


@dataclass(frozen=True, slots=True)
class FetchPage:
    """Fetch one diff page; answer with ``page_received`` (or ``failed``)."""

    source: str
    from_generation_id: bytes
    to_generation_id: bytes
    cursor: str | None


@dataclass(frozen=True, slots=True)
class Deliver:
    """Call the listener; answer with ``delivered(accepted, error)``."""

    event: Event


@dataclass(frozen=True, slots=True)
class WriteCheckpoint:
    """Commit ``new`` with CAS on ``expected``; answer ``checkpoint_written`` or ``checkpoint_rejected``."""

    expected: Mapping[str, bytes | None]
    new: Positions


Action = LoadCheckpoint | ReadHeads | WaitForChange | FetchPage | Deliver | WriteCheckpoint


class Phase(enum.Enum):
    LOAD = "load"
    HEADS = "heads"
    WAIT = "wait"
    OPEN = "open"
    SOURCE_START = "source_start"
    FETCH = "fetch"
    DATA = "data"
    SOURCE_END = "source_end"
    WINDOW_END = "window_end"
    CHECKPOINT = "checkpoint"
    ROLLBACK = "rollback"


# phases after on_start_window was accepted and before the window's end was accepted
_INSIDE_WINDOW = frozenset({Phase.SOURCE_START, Phase.FETCH, Phase.DATA, Phase.SOURCE_END, Phase.WINDOW_END})


class ProtocolViolation(RuntimeError):
    """The machine was fed an outcome that does not answer its current action (a bug in the loop)."""


class WindowMachine:
    """The pure window state machine.

    Invariants:
        * ``stored`` is the checkpoint as last loaded or written; positions are ``stored`` with null
          readers read as ``b""`` (the beginning).
        * A window's ``from`` is always the positions; its requested ``to`` is the heads read before it
          opened; its ``to`` for a source is the ``toGenerationId`` of that source's first diff page.
        * The checkpoint is requested only in phase CHECKPOINT, reached only after ``EndWindow`` was
          accepted; any rejection before that leads to ROLLBACK and then OPEN with the same window.
        * ``consecutive_rollbacks`` counts rollbacks since the last written checkpoint.
    """

    def __init__(self, sources: Sequence[str]) -> None:
        if not sources or len(set(sources)) != len(sources):
            raise InvalidRequest("a consumer needs one or more distinct sources")
        self.sources = tuple(sources)
        self.phase = Phase.LOAD
        self.stored: dict[str, bytes | None] = {}
        self.targets: dict[str, bytes] = {}
        self.window_to: dict[str, bytes] = {}
        self.consecutive_rollbacks = 0
        self._source_index = 0
        self._items: deque[DiffItem] = deque()
        self._cursor: str | None = None
        self._error: BaseException | None = None
        self._after_rollback = Phase.OPEN

    @property
    def positions(self) -> dict[str, bytes]:
        return {s: self.stored.get(s) or b"" for s in self.sources}

    @property
    def source(self) -> str:
        return self.sources[self._source_index]

    def next_action(self) -> Action:
        """What the loop must do now."""
        phase = self.phase
        if phase is Phase.LOAD:
            return LoadCheckpoint()
        if phase is Phase.HEADS:
            return ReadHeads()
        if phase is Phase.WAIT:
            return WaitForChange(self.positions)
        if phase is Phase.OPEN:
            return Deliver(StartWindow(self.positions))
        if phase is Phase.SOURCE_START:
            return Deliver(StartSource(self.source))
        if phase is Phase.FETCH:
            source = self.source
            return FetchPage(source, self.positions[source], self.targets[source], self._cursor)
        if phase is Phase.DATA:
            item = self._items[0]
            return Deliver(DataEvent(self.source, item.key, item.from_value, item.to_value))
        if phase is Phase.SOURCE_END:
            return Deliver(EndSource(self.source))
        if phase is Phase.WINDOW_END:
            return Deliver(EndWindow(dict(self.window_to)))
        if phase is Phase.CHECKPOINT:
            return WriteCheckpoint(dict(self.stored), dict(self.window_to))
        return Deliver(Rollback(self.positions, self._error))

    # --- outcomes ----------------------------------------------------------------------------------

    def _expect(self, *phases: Phase) -> None:
        if self.phase not in phases:
            raise ProtocolViolation(f"unexpected outcome in phase {self.phase.value}")

    def checkpoint_loaded(self, stored: Mapping[str, bytes | None]) -> None:
        self._expect(Phase.LOAD)
        self.stored = {s: stored.get(s) for s in self.sources}
        self.phase = Phase.HEADS

    def heads_read(self, heads: Positions) -> None:
        self._expect(Phase.HEADS)
        positions = self.positions
        if all(heads[s] == positions[s] for s in self.sources):
            self.phase = Phase.WAIT
            return
        self.targets = {s: heads[s] for s in self.sources}
        self.phase = Phase.OPEN

    def wait_ended(self) -> None:
        self._expect(Phase.WAIT)
        self.phase = Phase.HEADS

    def page_received(self, page: DiffPage) -> None:
        self._expect(Phase.FETCH)
        if self._cursor is None:
            self.window_to[self.source] = page.to_generation_id
        self._items.extend(page.items)
        self._cursor = page.cursor
        self.phase = Phase.DATA
        self._after_data()

    def delivered(self, accepted: bool, error: BaseException | None = None) -> None:
        """The listener's answer to a ``Deliver``: ``accepted`` False means "roll the window back"."""
        phase = self.phase
        self._expect(
            Phase.OPEN, Phase.SOURCE_START, Phase.DATA, Phase.SOURCE_END, Phase.WINDOW_END, Phase.ROLLBACK
        )
        if phase is Phase.ROLLBACK:
            self.phase = self._after_rollback
            self._error = None
            return
        if not accepted:
            self._roll_back(error, Phase.OPEN)
            return
        if phase is Phase.OPEN:
            self._source_index = 0
            self.window_to = {}
            self._start_source()
        elif phase is Phase.SOURCE_START:
            source = self.source
            if self.positions[source] == self.targets[source]:
                self.window_to[source] = self.targets[source]
                self.phase = Phase.SOURCE_END
            else:
                self._cursor = None
                self.phase = Phase.FETCH
        elif phase is Phase.DATA:
            self._items.popleft()
            self._after_data()
        elif phase is Phase.SOURCE_END:
            self._source_index += 1
            if self._source_index < len(self.sources):
                self._start_source()
            else:
                self.phase = Phase.WINDOW_END
        else:
            self.phase = Phase.CHECKPOINT

    def failed(self, error: BaseException) -> None:
        """An I/O error while fetching: roll back, then reload the checkpoint."""
        self._expect(Phase.FETCH, Phase.DATA)
        self._roll_back(error, Phase.LOAD)

    def abandon(self, error: BaseException) -> None:
        """The loop stops inside a window (interrupted): roll it back, then reload; a no-op outside one."""
        if self.phase in _INSIDE_WINDOW:
            self._roll_back(error, Phase.LOAD)

    def restart(self, error: BaseException) -> None:
        """Start over from the stored checkpoint (the loop lost or changed its lease): a window in
        progress is rolled back first; the checkpoint is reloaded next."""
        if self.phase in _INSIDE_WINDOW:
            self._roll_back(error, Phase.LOAD)
        elif self.phase is Phase.ROLLBACK:
            self._after_rollback = Phase.LOAD
        else:
            self.phase = Phase.LOAD

    def checkpoint_written(self) -> None:
        self._expect(Phase.CHECKPOINT)
        self.stored = {s: self.window_to[s] for s in self.sources}
        self.consecutive_rollbacks = 0
        self.phase = Phase.HEADS

    def checkpoint_rejected(self) -> None:
        """CAS lost or the outcome is unknown: reload what is stored (the window may come again)."""
        self._expect(Phase.CHECKPOINT)
        self.phase = Phase.LOAD

    def _start_source(self) -> None:
        self.phase = Phase.SOURCE_START

    def _after_data(self) -> None:
        if self._items:
            self.phase = Phase.DATA
        elif self._cursor is not None:
            self.phase = Phase.FETCH
        else:
            self.phase = Phase.SOURCE_END

    def _roll_back(self, error: BaseException | None, then: Phase) -> None:
        self._items.clear()
        self._cursor = None
        self._error = error
        self._after_rollback = then
        self.consecutive_rollbacks += 1
        self.phase = Phase.ROLLBACK
