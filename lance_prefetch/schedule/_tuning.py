"""Self-tuning readahead (``readahead="auto"``/``max_in_flight="auto"``): grow the depth while
the training loop waits, keep the smallest depth that reads about as fast as any, shrink it when
the loop never waits.

One knob, the *level*: takes in flight. The readahead follows it, ``(level + 1) * coalesce``
batches, within ``max_buffer_bytes`` but never below level 1; a fixed ``readahead`` or
``max_in_flight`` stays as given and caps the level. :class:`DepthTuner` is fed the iteration's
totals at every batch; :class:`PeriodMeter` cuts them into periods of ``period_s`` seconds, and
each period's wait fraction and rows/s are remembered for its level (:class:`LevelHistory`).
The policy is a state machine over :class:`Phase`: while the loop waits it *probes* (doubles the
level, or halves it when the last probe went up), judges the probe on the mean of
:data:`JUDGE_PERIODS` periods against the level before, keeps or undoes it and then *holds*;
when the loop does not wait for :data:`CALM_PERIODS` periods it gives one level back. The full
rules, and the measurements behind the constants, are in ``docs/design.md``.

Pure code: no threads, no I/O; the iteration calls :meth:`DepthTuner.observe` from ``next()``
and applies the answer with :meth:`~lance_prefetch.schedule._prefetcher.Prefetcher.resize`.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field

from lance_prefetch.schedule._periods import (
    GAIN,
    JUDGE_PERIODS,
    SETTLE,
    WAIT_CUT,
    WAIT_HIGH,
    LevelHistory,
    Period,
    PeriodMeter,
    mean,
)

__all__ = [
    "Bounds",
    "CALM_PERIODS",
    "DepthTuner",
    "GAIN",
    "JUDGE_PERIODS",
    "MAX_LEVEL",
    "PROBE_PERIODS",
    "Phase",
    "SETTLE",
    "START_LEVEL",
    "WAIT_CUT",
    "WAIT_HIGH",
    "WAIT_LOW",
    "WAIT_URGENT",
]

logger = logging.getLogger("lance_prefetch.tuning")

#: A period waiting more than WAIT_HIGH asks for more depth at once above this fraction; between
#: the two, only the second such period in a row does.
WAIT_URGENT = 0.05
#: A period waiting less than this fraction is calm.
WAIT_LOW = 0.002
#: Calm periods in a row before the level drops by one.
CALM_PERIODS = 8
#: Periods a level holds after a probe (and a floor after an undone shrink).
PROBE_PERIODS = 40
#: The most takes in flight ``"auto"`` goes to (an object store lowers it: ``max_level``).
MAX_LEVEL = 64
#: The level ``"auto"`` starts at (with a cache too: its first epoch reads the dataset).
START_LEVEL = 4


@dataclass(frozen=True)
class Bounds:
    """What the prefetcher should use: ``readahead`` batches, ``max_in_flight`` takes."""

    readahead: int
    max_in_flight: int


class Phase(enum.Enum):
    """Where the policy is. Invariant: a probe runs exactly in the two ``PROBING`` phases (then
    no hold counts down and no shrink is watched); ``HOLDING`` exactly when a hold counts down
    and no probe runs; ``STEADY`` otherwise."""

    STEADY = "steady"  #: the loop's wait may start a probe
    HOLDING = "holding"  #: no probe starts until the hold ends
    PROBING_UP = "probing up"  #: the level doubled; judged after JUDGE_PERIODS periods
    PROBING_DOWN = "probing down"  #: the level halved; judged likewise


@dataclass
class _Probe:
    before: int  # the level before the probe
    periods: list[Period] = field(default_factory=list)  # measured so far


class DepthTuner:
    """Chooses the readahead and in-flight bounds of an iteration from what it measures.

    Args:
        coalesce (int): batches per take, ``>= 1``.
        readahead (int | None): a fixed readahead (batches), or ``None`` for ``"auto"``.
        max_in_flight (int | None): a fixed in-flight bound (takes), or ``None`` for ``"auto"``.
        max_buffer_bytes (int): the most bytes of batches the readahead may hold.
        row_bytes (float | None): bytes a row takes, if known before reading (fixed-width
            columns); else learnt from :meth:`observe`'s figures.
        batch_size (int): rows per batch.
        take_bytes (float): bytes one take holds while it is read, besides its rows (what Lance
            fetches for it: :func:`~lance_prefetch.plan._coalesce.take_memory`); each take in flight
            counts them against ``max_buffer_bytes``. Default: ``0.0``.
        max_level (int): the most takes in flight ``"auto"`` goes to, ``>= 1``, at most
            :data:`MAX_LEVEL` (on an object store:
            :func:`~lance_prefetch.plan._coalesce.remote_max_level`). A fixed ``max_in_flight``
            is kept as given instead (up to :data:`MAX_LEVEL`). Default: :data:`MAX_LEVEL`.
        level (int): the starting level (takes in flight). Default: :data:`START_LEVEL`.
        period_s (float): the shortest period between decisions, seconds, ``> 0``. Default: 1.0.

    Raises:
        ValueError: ``period_s`` is not positive, or ``max_level`` is below 1.
    """

    def __init__(
        self,
        *,
        coalesce: int,
        readahead: int | None,
        max_in_flight: int | None,
        max_buffer_bytes: int,
        row_bytes: float | None,
        batch_size: int,
        take_bytes: float = 0.0,
        max_level: int = MAX_LEVEL,
        level: int = START_LEVEL,
        period_s: float = 1.0,
    ) -> None:
        if not period_s > 0:
            raise ValueError(f"period_s should be > 0, but got period_s={period_s!r}")
        if max_level < 1:
            raise ValueError(f"max_level should be >= 1, but got max_level={max_level!r}")
        self.coalesce, self.batch_size = coalesce, batch_size
        self.fixed_readahead, self.fixed_in_flight = readahead, max_in_flight
        self.max_buffer_bytes, self.row_bytes = max_buffer_bytes, row_bytes
        self.take_bytes, self.max_level = take_bytes, min(max_level, MAX_LEVEL)
        self.meter, self.history = PeriodMeter(period_s), LevelHistory()
        self.level = self._clamp(level)
        self.phase = Phase.STEADY
        self._probe: _Probe | None = None  # set exactly in the PROBING phases
        self.hold_left = 0  # periods of HOLDING left
        self.next_probe = Phase.PROBING_UP
        self.calm = 0  # calm periods in a row
        self.waited_before = False  # the period before waited more than WAIT_HIGH
        # a shrink made the loop wait: do not go below this level for floor_left more periods
        self.floor: int | None = None
        self.floor_left = 0
        # the level before the last shrink, watched for shrunk_left more periods
        self.shrunk_from: int | None = None
        self.shrunk_left = 0
        self.decided_on: Period = (0.0, 0.0)  # what the last decision was made on
        self.given = self.bounds()  # the bounds last handed out

    @property
    def period_s(self) -> float:
        """The shortest period between decisions, seconds."""
        return self.meter.period_s

    @period_s.setter
    def period_s(self, seconds: float) -> None:
        self.meter.period_s = seconds

    @property
    def probe(self) -> tuple[str, int] | None:
        """``("up" | "down", level before)`` while a probe runs, else ``None``."""
        if self._probe is None:
            return None
        return ("up" if self.phase is Phase.PROBING_UP else "down", self._probe.before)

    @property
    def seen(self) -> dict[int, Period]:
        """See :attr:`LevelHistory.seen`."""
        return self.history.seen

    # -- bounds ---------------------------------------------------------------------------------
    def _max_level(self) -> int:
        """The highest level the caps allow: ``max_level`` (or a fixed ``max_in_flight`` instead,
        up to ``MAX_LEVEL``), and what the readahead holds (a fixed ``readahead``, or
        ``max_buffer_bytes`` once the bytes of a row are known: ``level + 1`` takes' rows and
        ``level`` takes' ``take_bytes``, those in flight, within it). At least 1: one take being
        read and one being consumed."""
        cap = self.max_level
        if self.fixed_in_flight is not None:
            cap = min(MAX_LEVEL, self.fixed_in_flight)
        if self.fixed_readahead is not None:
            cap = min(cap, max(self.fixed_readahead // self.coalesce, 1))
            if self.take_bytes:
                cap = min(cap, max(int(self.max_buffer_bytes // self.take_bytes), 1))
        elif self.row_bytes:
            rows_bytes = self.row_bytes * self.batch_size * self.coalesce  # one take's rows
            room = (self.max_buffer_bytes - rows_bytes) // (rows_bytes + self.take_bytes)
            cap = min(cap, max(int(room), 1))
        return cap

    def _clamp(self, level: int) -> int:
        return max(1, min(level, self._max_level()))

    def bounds(self) -> Bounds:
        """The bounds for the current level."""
        level = self._clamp(self.level)
        if self.fixed_readahead is not None:
            readahead = self.fixed_readahead
            level = min(level, readahead)
        else:
            readahead = (level + 1) * self.coalesce
        in_flight = level
        if self.fixed_in_flight is not None:  # as given, as far as the readahead has room
            in_flight = min(self.fixed_in_flight, max(readahead // self.coalesce, 1))
            if self.fixed_readahead is not None:
                in_flight = self.fixed_in_flight
        return Bounds(readahead, min(in_flight, readahead))

    def restart(self) -> Bounds:
        """A new iteration starts at the level reached so far (a probe not judged yet is undone:
        the level before it); periods start afresh, but at an unchanged level the calm periods
        and a wait to confirm carry over. Returns the bounds to start with."""
        if self._probe is not None:
            self.level, self._probe, self.phase = self._probe.before, None, Phase.STEADY
            self.calm, self.waited_before = 0, False
        self.meter.restart()
        self.shrunk_from = None
        self.given = self.bounds()
        return self.given

    # -- decisions ------------------------------------------------------------------------------
    def observe(
        self, now: float, waited_s: float, rows: int, nbytes: int, rows_read: int
    ) -> Bounds | None:
        """Totals of the iteration so far: ``waited_s`` seconds waited in ``next()``, ``rows``
        delivered, ``nbytes`` Arrow bytes read for ``rows_read`` rows. New bounds, or ``None``
        when they stay (or the period is not over)."""
        if rows_read and not self.row_bytes:
            self.row_bytes = nbytes / rows_read
            if self.bounds() != self.given:  # a lower byte cap
                return self._hand_out(now, None)
        period = self.meter.observe(now, waited_s, rows)
        if period is None:
            return None
        self._decide(*period)
        if self.bounds() == self.given:
            return None
        return self._hand_out(now, self.decided_on)

    def _hand_out(self, now: float, decided_on: Period | None) -> Bounds:
        before, after = self.given, self.bounds()
        why = (
            "the bytes of a row, learnt from the first reads, lower the cap"
            if decided_on is None
            else f"the period(s) before waited {100 * decided_on[0]:.1f}%, read "
            f"{decided_on[1]:.0f} rows/s"
        )
        logger.debug(
            "readahead='auto': %d -> %d takes in flight, readahead %d -> %d batches (%s)",
            before.max_in_flight,
            after.max_in_flight,
            before.readahead,
            after.readahead,
            why,
        )
        self.given = after
        self.meter.settle(now)
        return after

    def _decide(self, wait: float, rate: float) -> None:
        """One period measured: count the timers down, then the transition of the phase."""
        self.decided_on = (wait, rate)
        level = self._clamp(self.level)
        self._count_down()
        if self.phase is Phase.PROBING_UP:
            self._probing_up(level, wait, rate)
        elif self.phase is Phase.PROBING_DOWN:
            self._probing_down(level, wait, rate)
        elif self.phase is Phase.HOLDING:
            self._holding(level, wait, rate)
        else:
            self._steady(level, wait, rate)

    def _count_down(self) -> None:
        if self.hold_left:
            self.hold_left -= 1
            if not self.hold_left:
                self.phase = Phase.STEADY
        if self.floor is not None:
            self.floor_left -= 1
            if self.floor_left <= 0:
                self.floor = None
        if self.shrunk_from is not None:
            self.shrunk_left -= 1
            if self.shrunk_left < 0:
                self.shrunk_from = None

    # -- the transitions, one per phase ---------------------------------------------------------
    def _steady(self, level: int, wait: float, rate: float) -> None:
        """A wait (two periods in a row, unless urgent) starts a probe; calm gives a level back."""
        if self._unprobed(level, wait, rate):
            self._start_probe(level)

    def _holding(self, level: int, wait: float, rate: float) -> None:
        """As :meth:`_steady`, but no probe starts."""
        self._unprobed(level, wait, rate)

    def _probing_up(self, level: int, wait: float, rate: float) -> None:
        """Judged on its periods' mean: kept if it paid (the climb goes on while the loop still
        waits; a doubling that only stopped the wait holds, and tries below next), else back to
        the level before and hold, or try below first if that was never measured."""
        judged = self._judge(level, wait, rate)
        if judged is None:
            return
        before, wait, rate = judged
        if wait <= WAIT_HIGH:
            if rate < GAIN * self.history.seen.get(before, (1.0, 0.0))[1]:
                self._hold(level)  # kept, but try below after a while: was it noise?
                self.next_probe = Phase.PROBING_DOWN
            self._calm_or_shrink(level, wait)
            return
        self.calm = 0
        if not self.history.paid(before, wait, rate):
            below = max(before // 2, self.floor or 1)
            self.next_probe = Phase.PROBING_DOWN
            if below < before and below not in self.history.seen:
                self.level = before
            else:
                self._hold(before)
            return
        if self._undo_shrink(level):
            return
        self._start_probe(level)

    def _probing_down(self, level: int, wait: float, rate: float) -> None:
        """Judged on its periods' mean: kept and held if about as good (or the loop stopped
        waiting), else back to the level before and hold."""
        judged = self._judge(level, wait, rate)
        if judged is None:
            return
        before, wait, rate = judged
        if wait <= WAIT_HIGH:
            self._hold(level)
            self._calm_or_shrink(level, wait)
            return
        self.calm = 0
        self._hold(level if self.history.as_good(before, wait, rate) else before)

    # -- helpers --------------------------------------------------------------------------------
    def _judge(self, level: int, wait: float, rate: float) -> tuple[int, float, float] | None:
        """Add a period to the running probe; once it has :data:`JUDGE_PERIODS`, end it:
        ``(level before, mean wait, mean rows/s)``."""
        probe = self._probe
        assert probe is not None  # the PROBING phases' invariant
        probe.periods.append((wait, rate))
        if len(probe.periods) < JUDGE_PERIODS:
            return None
        wait, rate = self.decided_on = mean(probe.periods)
        self._probe, self.phase = None, Phase.STEADY
        self.waited_before = wait > WAIT_HIGH
        self.history.remember(level, probe.periods)
        return probe.before, wait, rate

    def _unprobed(self, level: int, wait: float, rate: float) -> bool:
        """A period outside a probe; whether a probe may start now (the loop waited, urgently or
        two periods in a row, and no shrink is undone)."""
        waited_before, self.waited_before = self.waited_before, wait > WAIT_HIGH
        if wait <= WAIT_HIGH:
            self._calm_or_shrink(level, wait)
            return False
        self.calm = 0
        self.history.remember(level, [(wait, rate)])
        if self._undo_shrink(level):
            return False
        return wait > WAIT_URGENT or waited_before

    def _calm_or_shrink(self, level: int, wait: float) -> None:
        if wait >= WAIT_LOW:
            self.calm = 0
            return
        self.calm += 1
        if self.calm >= CALM_PERIODS and level > max(1, self.floor or 1):
            self.calm = 0
            self.shrunk_from, self.shrunk_left, self.level = level, CALM_PERIODS, level - 1

    def _undo_shrink(self, level: int) -> bool:
        """The loop waits: if the last shrink made it, undo it and keep that level as a floor."""
        shrunk_from, self.shrunk_from = self.shrunk_from, None
        if shrunk_from is None or shrunk_from <= level:
            return False
        self.level = self._clamp(shrunk_from)
        self.floor, self.floor_left = self.level, PROBE_PERIODS
        return True

    def _start_probe(self, level: int) -> None:
        """Probe in the direction due: down to half (not below the floor), else up to double
        (within the caps; at a cap, down next time)."""
        lowest = max(1, self.floor or 1)
        if self.next_probe is Phase.PROBING_DOWN:
            self.next_probe = Phase.PROBING_UP
            if level > lowest:
                self._probe, self.phase = _Probe(level), Phase.PROBING_DOWN
                self.level = max(level // 2, lowest)
                return
        target = self._clamp(level * 2)
        if target > level:
            self._probe, self.phase, self.level = _Probe(level), Phase.PROBING_UP, target
        else:
            self.next_probe = Phase.PROBING_DOWN

    def _hold(self, level: int) -> None:
        self.level, self.hold_left, self.phase = level, PROBE_PERIODS, Phase.HOLDING
