"""Self-tuning readahead: grow the depth while the training loop waits, keep the smallest depth
that reads about as fast as any, shrink it when the loop never waits.

One knob, the *level*: how many takes may run at once (``max_in_flight``). The readahead follows
it: ``readahead = (level + 1) * coalesce`` batches, room for ``level`` takes in flight plus the
batches of one take being consumed, within ``max_buffer_bytes`` but never below two takes (level
1). With only one of ``readahead``/``max_in_flight`` set to ``"auto"`` the other stays as given
and caps the level: a fixed ``readahead`` is kept, with up to ``readahead // coalesce`` takes in
flight; a fixed ``max_in_flight`` is kept as far as the tuned readahead has room for that many
takes.

:class:`DepthTuner` is fed, every period of at least ``period_s`` seconds, the loop's total wait,
the rows delivered and the bytes read per batch so far, and answers with new bounds or ``None``.
Each period's wait fraction and rows/s are remembered for its level. While the loop waits more
than :data:`WAIT_HIGH` of a period (two periods in a row, unless it waited more than
:data:`WAIT_URGENT`: a wait near the threshold is often noise), the tuner climbs by *probes*:

Each probe runs :data:`JUDGE_PERIODS` periods and is judged on their mean, against the mean of
as many latest periods at the level before (one period's rows/s varies by 10-25%: judged on one,
a level 20% slower passed on a lucky period).

- **up**: the level doubles (up to the caps). The probe's periods judge it: it *paid* if it
  delivered :data:`GAIN` times the rows/s of the level before, or cut the wait to
  :data:`WAIT_CUT` of it while keeping rows/s within ``1 / GAIN`` of it, or the loop stopped
  waiting; then the climb goes on (but a doubling that only stopped the wait, without more
  rows/s, holds, and the next probe goes down: a wait near the threshold may have been noise).
  Both tests are needed: reading as fast as it can, the loop waits nearly all the time at any
  level and only rows/s tells; behind a training step, rows/s is the step's and only the wait
  tells. If it did not pay, the level goes back and **holds** for :data:`PROBE_PERIODS` periods
  (more takes at once do not help: the CPU or the store is the limit, and more threads would
  only add memory and contention); but if the level below was never measured, a probe down
  comes first, in the next period (the start level may be above the best one: on 2 cores, 2
  takes of 1,024 rows at once read faster than 4).
- **down**: when a hold ends, the next probe goes the other way: the level halves, and stays
  halved (holding) if it delivered at least ``1 / GAIN`` of the rows/s without waiting more
  than ``1 / WAIT_CUT`` times as much (of at least :data:`WAIT_HIGH`); otherwise it goes back
  and holds. Probes alternate, so a level
  that one lucky period let grow is tried again from below: the tuner keeps the smallest level
  within ~10% of the best rows/s it measured, rather than ratcheting up on noise.

When the loop does not wait:

- **shrink** after :data:`CALM_PERIODS` periods in a row in which it waited less than
  :data:`WAIT_LOW`: the level drops by one (memory and threads back). If the loop waits within
  the next :data:`CALM_PERIODS` periods, the level goes back up by that one and is kept as a
  floor for :data:`PROBE_PERIODS` periods (no shrink-wait-grow cycle every few seconds).

A level the caps lower (the bytes of a row, learnt from the first reads) is handed out at the
next ``observe`` whatever the period.

After each change, :data:`SETTLE` of a period passes before the next period starts: takes started
at the old level still land in it, and would be counted for the new one.

Pure code: no threads, no I/O; the iteration calls :meth:`DepthTuner.observe` from ``next()``
and applies the answer with :meth:`~lance_prefetch.scheduling.Prefetcher.resize`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ._validate import check_int

__all__ = [
    "CALM_PERIODS",
    "DEFAULT_MAX_BUFFER_BYTES",
    "DepthTuner",
    "GAIN",
    "JUDGE_PERIODS",
    "MAX_LEVEL",
    "PROBE_PERIODS",
    "SETTLE",
    "START_LEVEL",
    "START_LEVEL_MEMORY",
    "WAIT_CUT",
    "WAIT_HIGH",
    "WAIT_LOW",
    "WAIT_URGENT",
    "check_depth",
]

logger = logging.getLogger(__name__)

#: A period in which the loop waited more than this fraction of the time asks for more depth
#: (the wait the issue's users aim under: 1% of the training loop).
WAIT_HIGH = 0.01
#: A period above this fraction asks for more depth at once; between WAIT_HIGH and this, only the
#: second such period in a row does.
WAIT_URGENT = 0.05
#: A period below this fraction is calm.
WAIT_LOW = 0.002
#: Calm periods in a row before the level drops by one.
CALM_PERIODS = 8
#: A grown level pays when it delivers at least this many times the rows/s of the level before
#: it ...
GAIN = 1.1
#: ... or when its wait fraction is at most this fraction of the level before's.
WAIT_CUT = 2 / 3
#: Periods a probe runs before it is judged, on their mean, against the mean of as many latest
#: periods at the level before (one period's rows/s varied by 10-25% on local-disk takes here: a
#: halving 20% slower passed on one lucky period, then held for PROBE_PERIODS).
JUDGE_PERIODS = 2
#: After a change, this fraction of a period is left out before the next period starts.
SETTLE = 0.5
#: Periods a level holds after a probe (or a floor after an undone shrink).
PROBE_PERIODS = 40
#: The most takes in flight ``"auto"`` goes to.
MAX_LEVEL = 64
#: The level ``"auto"`` starts at: takes from files or object storage.
START_LEVEL = 4
#: ... and with ``cache="memory"``: such a take is a copy in memory (~0.6 ms for 1,024 rows of
#: 528 bytes here), so one in flight keeps ahead of the loop, and more only compete with the
#: training loop for the GIL (1 in flight read 1.6-1.8x the rows/s of 4 on 2 cores).
START_LEVEL_MEMORY = 1
#: Default ``max_buffer_bytes``: 256 MiB.
DEFAULT_MAX_BUFFER_BYTES = 256 << 20


def _mean(periods: list[tuple[float, float]]) -> tuple[float, float]:
    """The mean (wait, rows/s) of ``periods``."""
    return (
        sum(wait for wait, _ in periods) / len(periods),
        sum(rate for _, rate in periods) / len(periods),
    )


def check_depth(name: str, value: object, *, minimum: int = 1) -> int | str:
    """``value`` as an int ``>= minimum`` or the string ``"auto"``.

    Raises:
        TypeError: neither (another string included). ValueError: an int below ``minimum``.
    """
    if isinstance(value, str):
        if value != "auto":
            raise TypeError(
                f"{name} should be an integer or 'auto', but got {name}={value!r} (str)"
            )
        return value
    try:
        return check_int(name, value, minimum=minimum)
    except TypeError as exc:
        raise TypeError(
            str(exc).replace("should be an integer,", "should be an integer or 'auto',")
        ) from None


@dataclass(frozen=True)
class Bounds:
    """What the prefetcher should use: ``readahead`` batches, ``max_in_flight`` takes."""

    readahead: int
    max_in_flight: int


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
        level (int): the starting level (takes in flight). Default: :data:`START_LEVEL` (the
            loader passes :data:`START_LEVEL_MEMORY` with ``cache="memory"``).
        period_s (float): the shortest period between decisions, seconds. Default: 1.0 (rows/s
            over half a second varied by 10-25% on a steady loop on local disk here, enough for
            a probe to pass on noise).
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
        level: int = START_LEVEL,
        period_s: float = 1.0,
    ) -> None:
        self.coalesce, self.batch_size = coalesce, batch_size
        self.fixed_readahead, self.fixed_in_flight = readahead, max_in_flight
        if not period_s > 0:
            raise ValueError(f"period_s should be > 0, but got period_s={period_s!r}")
        self.max_buffer_bytes, self.row_bytes, self.period_s = max_buffer_bytes, row_bytes, period_s
        self.level = self._clamp(level)
        self.hold_left = 0  # periods before the next probe
        self.floor: int | None = None  # a shrink made the loop wait: do not go below for a while
        self.floor_left = 0
        self.calm = 0
        # level -> its last JUDGE_PERIODS periods' (wait, rows/s); see ``seen``
        self._latest: dict[int, list[tuple[float, float]]] = {}
        self.probe: tuple[str, int] | None = None  # ("up" | "down", level before)
        self._probe_periods: list[tuple[float, float]] = []  # the probe's periods so far
        self.decided_on = (0.0, 0.0)  # (wait, rows/s) the last decision was made on
        self.next_probe = "up"
        self.shrunk_from: int | None = None  # the level before the last shrink ...
        self.shrunk_left = 0  # ... for this many more periods
        self.waited_before = False  # the period before waited more than WAIT_HIGH
        self.given: Bounds | None = None  # the bounds last handed out (set below)
        self._mark: tuple[float, float, int] | None = None  # (time, waited, rows) at period start
        self._settle_until = float("-inf")
        self.given = self.bounds()

    # -- bounds ---------------------------------------------------------------------------------
    def _max_level(self) -> int:
        """The highest level the caps allow: ``MAX_LEVEL``, a fixed ``max_in_flight``, and what
        the readahead holds (a fixed ``readahead``, or ``max_buffer_bytes`` once the bytes of a
        row are known). At least 1: one take being read and one being consumed."""
        cap = MAX_LEVEL
        if self.fixed_in_flight is not None:
            cap = min(cap, self.fixed_in_flight)
        if self.fixed_readahead is not None:
            cap = min(cap, max(self.fixed_readahead // self.coalesce, 1))
        elif self.row_bytes:
            batch_bytes = self.row_bytes * self.batch_size
            cap = min(cap, max(int(self.max_buffer_bytes // (batch_bytes * self.coalesce)) - 1, 1))
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
        and a wait to confirm carry over (epochs shorter than a few periods would otherwise
        never confirm a small wait nor shrink). Returns the bounds to start with."""
        if self.probe is not None:
            self.level, self.probe = self.probe[1], None
            self.calm, self.waited_before = 0, False
        self._probe_periods = []
        self._mark = None
        self._settle_until = float("-inf")
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
                return self._hand_out(now, None, None)
        if now < self._settle_until:
            return None
        if self._mark is None:
            self._mark = (now, waited_s, rows)
            return None
        start, waited_before, rows_before = self._mark
        span = now - start
        if span < self.period_s:
            return None
        self._mark = (now, waited_s, rows)
        wait = (waited_s - waited_before) / span
        rate = (rows - rows_before) / span
        self._decide(wait, rate)
        wait, rate = self.decided_on  # a probe's: the mean of its periods
        if self.bounds() == self.given:
            return None
        return self._hand_out(now, wait, rate)

    def _hand_out(self, now: float, wait: float | None, rate: float | None) -> Bounds:
        before, after = self.given, self.bounds()
        why = (
            "the bytes of a row, learnt from the first reads, lower the cap"
            if wait is None
            else f"the period(s) before waited {100 * wait:.1f}%, read {rate:.0f} rows/s"
        )
        logger.debug(
            "readahead='auto': %d -> %d takes in flight, readahead %d -> %d batches (%s)",
            before.max_in_flight, after.max_in_flight, before.readahead, after.readahead, why,
        )  # fmt: skip
        self.given = after
        self._mark, self._settle_until = None, now + SETTLE * self.period_s
        return after

    def _paid(self, before: int, wait: float, rate: float) -> bool:
        """Whether going up from level ``before`` paid (see the module)."""
        wait_before, rate_before = self.seen.get(before, (1.0, 0.0))
        if rate >= GAIN * rate_before:
            return True
        # a wait cut counts only if rows/s held (fewer rows waited on is not a gain)
        return wait <= WAIT_CUT * wait_before and GAIN * rate >= rate_before

    def _as_good(self, before: int, wait: float, rate: float) -> bool:
        """Whether the level after going down from ``before`` is about as good."""
        wait_before, rate_before = self.seen.get(before, (0.0, float("inf")))
        return GAIN * rate >= rate_before and WAIT_CUT * wait <= max(wait_before, WAIT_HIGH)

    @property
    def seen(self) -> dict[int, tuple[float, float]]:
        """Level -> the mean (wait fraction, rows/s) of its latest :data:`JUDGE_PERIODS`
        periods, for the levels measured so far."""
        return {level: _mean(periods) for level, periods in self._latest.items()}

    def _remember(self, level: int, periods: list[tuple[float, float]]) -> None:
        """Record periods (wait, rows/s) at ``level``, keeping its latest
        :data:`JUDGE_PERIODS`."""
        latest = self._latest.setdefault(level, [])
        latest.extend(periods)
        del latest[:-JUDGE_PERIODS]

    def _hold(self, level: int) -> None:
        self.level, self.hold_left = level, PROBE_PERIODS

    def _decide(self, wait: float, rate: float) -> None:
        self.decided_on = (wait, rate)
        level = self._clamp(self.level)
        self.hold_left = max(self.hold_left - 1, 0)
        if self.floor is not None:
            self.floor_left -= 1
            if self.floor_left <= 0:
                self.floor = None
        if self.shrunk_from is not None:
            self.shrunk_left -= 1
            if self.shrunk_left < 0:
                self.shrunk_from = None
        periods = [(wait, rate)]
        if self.probe is not None:  # judged on the mean of its periods
            self._probe_periods.append((wait, rate))
            if len(self._probe_periods) < JUDGE_PERIODS:
                return
            periods, self._probe_periods = self._probe_periods, []
            wait, rate = self.decided_on = _mean(periods)
        probe, self.probe = self.probe, None
        waited_before, self.waited_before = self.waited_before, wait > WAIT_HIGH
        if wait <= WAIT_HIGH:
            if probe is not None:  # the loop stopped waiting: up paid, down was enough
                direction, before = probe
                self._remember(level, periods)
                if direction == "down":
                    self._hold(level)
                elif rate < GAIN * self.seen.get(before, (1.0, 0.0))[1]:
                    self._hold(level)  # kept, but try below after a while: was it noise?
                    self.next_probe = "down"
            if wait >= WAIT_LOW:
                self.calm = 0
                return
            self.calm += 1
            if self.calm >= CALM_PERIODS and level > max(1, self.floor or 1):
                self.calm = 0
                self.shrunk_from, self.shrunk_left, self.level = level, CALM_PERIODS, level - 1
            return
        self.calm = 0
        if probe is not None:
            direction, before = probe
            self._remember(level, periods)
            if direction == "up" and not self._paid(before, wait, rate):
                # more takes at once did not help: back, and stay a while; but first try below
                # if that level was never measured (the start level may be above the best one)
                below = max(before // 2, self.floor or 1)
                self.next_probe = "down"
                if below < before and below not in self.seen:
                    self.level = before
                else:
                    self._hold(before)
                return
            if direction == "down":
                self._hold(level if self._as_good(before, wait, rate) else before)
                return
        self._remember(level, periods)
        shrunk_from, self.shrunk_from = self.shrunk_from, None
        if shrunk_from is not None and shrunk_from > level:
            # the last shrink made the loop wait: undo it, and keep that level a while
            self.level = self._clamp(shrunk_from)
            self.floor, self.floor_left = self.level, PROBE_PERIODS
            return
        if self.hold_left or (probe is None and wait <= WAIT_URGENT and not waited_before):
            return  # holding, or a small wait not confirmed by the period before
        lowest = max(1, self.floor or 1)
        if self.next_probe == "down":
            self.next_probe = "up"
            if level > lowest:
                self.probe, self.level = ("down", level), max(level // 2, lowest)
                return
        target = self._clamp(level * 2)
        if target > level:
            self.probe, self.level = ("up", level), target
        else:  # at a cap: nothing to try above, so below next time
            self.next_probe = "down"
