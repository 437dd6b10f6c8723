"""Self-tuning readahead: grow the depth while the training loop waits, keep it where more
depth stops paying, shrink it when the loop never waits.

One knob, the *level*: how many takes may run at once (``max_in_flight``). The readahead follows
it: ``readahead = (level + 1) * coalesce`` batches, room for ``level`` takes in flight plus the
batches of one take being consumed, always within ``max_buffer_bytes``. (With only one of
``readahead``/``max_in_flight`` set to ``"auto"`` the other stays fixed and bounds the level.)

:class:`DepthTuner` is fed, every period of at least ``period_s`` seconds, the loop's total wait,
the rows delivered and the bytes read per batch so far, and answers with new bounds or ``None``:

- **grow** while the loop waited more than :data:`WAIT_HIGH` of the period: the level doubles
  (up to the caps) and the period's rows/s is remembered for that level;
- **plateau**: when a grown level did not deliver at least :data:`GAIN` times the rows/s of the
  level before it, the tuner steps back to the better level and does not grow past it again for
  :data:`PROBE_PERIODS` periods (more takes at once do not help: the CPU or the store is the
  limit, and more threads would only add memory and contention);
- **shrink** after :data:`CALM_PERIODS` periods in a row in which the loop waited less than
  :data:`WAIT_LOW`: the level drops by one (memory and threads back), and grows again if the loop
  starts waiting.

Pure code: no threads, no I/O; the iteration calls :meth:`DepthTuner.observe` from ``next()``
and applies the answer with :meth:`~lance_prefetch.scheduling.Prefetcher.resize`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._validate import check_int

__all__ = [
    "CALM_PERIODS",
    "DEFAULT_MAX_BUFFER_BYTES",
    "DepthTuner",
    "GAIN",
    "MAX_LEVEL",
    "PROBE_PERIODS",
    "WAIT_HIGH",
    "WAIT_LOW",
    "check_depth",
]

#: A period in which the loop waited more than this fraction of the time asks for more depth.
WAIT_HIGH = 0.02
#: A period below this fraction is calm.
WAIT_LOW = 0.002
#: Calm periods in a row before the level drops by one.
CALM_PERIODS = 8
#: A grown level must deliver at least this many times the rows/s of the level before it.
GAIN = 1.1
#: Periods a plateau holds before growing past it is tried again.
PROBE_PERIODS = 40
#: The most takes in flight ``"auto"`` goes to.
MAX_LEVEL = 64
#: Default ``max_buffer_bytes``: 256 MiB.
DEFAULT_MAX_BUFFER_BYTES = 256 << 20


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
        level (int): the starting level (takes in flight). Default: 4.
        period_s (float): the shortest period between decisions, seconds. Default: 0.5.
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
        level: int = 4,
        period_s: float = 0.5,
    ) -> None:
        self.coalesce, self.batch_size = coalesce, batch_size
        self.fixed_readahead, self.fixed_in_flight = readahead, max_in_flight
        self.max_buffer_bytes, self.row_bytes, self.period_s = max_buffer_bytes, row_bytes, period_s
        self.level = self._clamp(level)
        self.ceiling: int | None = None  # a plateau: do not grow past this level for a while
        self.ceiling_left = 0
        self.calm = 0
        self.rates: dict[int, float] = {}  # level -> rows/s measured there (latest)
        self.grew_from: int | None = None  # the level before the last growth
        self._mark: tuple[float, float, int] | None = None  # (time, waited, rows) at period start

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
        in_flight = level  # a fixed max_in_flight is a cap of the level (_max_level)
        if self.fixed_in_flight is not None and self.fixed_readahead is not None:
            in_flight = self.fixed_in_flight
        return Bounds(readahead, min(in_flight, readahead))

    def restart(self) -> None:
        """A new iteration starts (at the level reached so far): periods start afresh."""
        self._mark = None
        self.grew_from = None
        self.calm = 0

    # -- decisions ------------------------------------------------------------------------------
    def observe(
        self, now: float, waited_s: float, rows: int, nbytes: int, rows_read: int
    ) -> Bounds | None:
        """Totals of the iteration so far: ``waited_s`` seconds waited in ``next()``, ``rows``
        delivered, ``nbytes`` Arrow bytes read for ``rows_read`` rows. New bounds, or ``None``
        when they stay (or the period is not over)."""
        if rows_read and not self.row_bytes:
            self.row_bytes = nbytes / rows_read
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
        before = self.bounds()
        self._decide(wait, rate)
        after = self.bounds()
        return after if after != before else None

    def _decide(self, wait: float, rate: float) -> None:
        level = self._clamp(self.level)
        if self.ceiling is not None:
            self.ceiling_left -= 1
            if self.ceiling_left <= 0:
                self.ceiling = None
        if wait > WAIT_HIGH:
            self.calm = 0
            previous = self.grew_from
            self.grew_from = None
            if previous is not None and rate < GAIN * self.rates.get(previous, 0.0):
                # the last growth did not pay: back to the better level, and stay there
                self.rates[level] = rate
                self.level = previous
                self.ceiling, self.ceiling_left = previous, PROBE_PERIODS
                return
            self.rates[level] = rate
            target = self._clamp(level * 2)
            if self.ceiling is not None:
                target = min(target, self.ceiling)
            if target > level:
                self.grew_from = level
                self.level = target
            return
        self.grew_from = None
        if wait < WAIT_LOW:
            self.calm += 1
            if self.calm >= CALM_PERIODS and level > 1:
                self.calm = 0
                self.level = level - 1
        else:
            self.calm = 0
