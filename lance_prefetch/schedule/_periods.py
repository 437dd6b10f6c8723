"""What the self-tuner measures (:mod:`lance_prefetch.schedule._tuning`): periods cut from an iteration's
running totals (:class:`PeriodMeter`), the latest periods measured at each level
(:class:`LevelHistory`), and the two judgements made against them. Pure code."""

from __future__ import annotations

__all__ = [
    "GAIN",
    "JUDGE_PERIODS",
    "LevelHistory",
    "Period",
    "PeriodMeter",
    "SETTLE",
    "WAIT_CUT",
    "WAIT_HIGH",
    "mean",
]

#: A period waiting more than this fraction of its time asks for more depth.
WAIT_HIGH = 0.01
#: A level pays when it reads this many times the rows/s of the level it was compared with ...
GAIN = 1.1
#: ... or cuts the wait fraction to this fraction of it, with rows/s held within ``1 / GAIN``.
WAIT_CUT = 2 / 3
#: Periods a probe runs; it is judged on their mean, and this many are kept per level.
JUDGE_PERIODS = 2
#: After a change, this fraction of a period is left out before the next period starts.
SETTLE = 0.5

#: One period: (wait fraction, rows/s).
Period = tuple[float, float]


class PeriodMeter:
    """Cuts an iteration's running totals into periods of at least ``period_s`` seconds, leaving
    out the settling time after each change (reads started at the old level still land there)."""

    def __init__(self, period_s: float) -> None:
        self.period_s = period_s
        self._mark: tuple[float, float, int] | None = None  # (time, waited, rows) at its start
        self._settle_until = float("-inf")

    def restart(self) -> None:
        """Periods start afresh (a new iteration)."""
        self._mark, self._settle_until = None, float("-inf")

    def settle(self, now: float) -> None:
        """The bounds changed at ``now``: the next period starts :data:`SETTLE` periods later."""
        self._mark, self._settle_until = None, now + SETTLE * self.period_s

    def observe(self, now: float, waited_s: float, rows: int) -> Period | None:
        """The ``(wait fraction, rows/s)`` of the period ending now, or ``None`` while none ends."""
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
        return (waited_s - waited_before) / span, (rows - rows_before) / span


class LevelHistory:
    """The latest :data:`JUDGE_PERIODS` periods measured at each level, and the two judgements
    made against them."""

    def __init__(self) -> None:
        #: level -> its latest periods, oldest first
        self.latest: dict[int, list[Period]] = {}

    def remember(self, level: int, periods: list[Period]) -> None:
        """Record ``periods`` measured at ``level``, keeping its latest :data:`JUDGE_PERIODS`."""
        latest = self.latest.setdefault(level, [])
        latest.extend(periods)
        del latest[:-JUDGE_PERIODS]

    @property
    def seen(self) -> dict[int, Period]:
        """Level -> the mean (wait fraction, rows/s) of its latest periods."""
        return {level: mean(periods) for level, periods in self.latest.items()}

    def paid(self, before: int, wait: float, rate: float) -> bool:
        """Whether going up from level ``before`` paid: :data:`GAIN` times its rows/s, or its
        wait cut to :data:`WAIT_CUT` with rows/s held (fewer rows waited on is no gain)."""
        wait_before, rate_before = self.seen.get(before, (1.0, 0.0))
        if rate >= GAIN * rate_before:
            return True
        return wait <= WAIT_CUT * wait_before and GAIN * rate >= rate_before

    def as_good(self, before: int, wait: float, rate: float) -> bool:
        """Whether the level after going down from ``before`` is about as good: rows/s within
        ``1 / GAIN`` without waiting more than ``1 / WAIT_CUT`` times as much (of at least
        :data:`WAIT_HIGH`)."""
        wait_before, rate_before = self.seen.get(before, (0.0, float("inf")))
        return GAIN * rate >= rate_before and WAIT_CUT * wait <= max(wait_before, WAIT_HIGH)


def mean(periods: list[Period]) -> Period:
    """The mean (wait, rows/s) of ``periods``."""
    return (
        sum(wait for wait, _ in periods) / len(periods),
        sum(rate for _, rate in periods) / len(periods),
    )
