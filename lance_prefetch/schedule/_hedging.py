"""Hedged takes: a second ``take`` of the same rows for a take that runs far past the recent ones,
the first to finish used.

:class:`HedgePolicy` is the public, picklable description (when to hedge, how many extra takes at
most). :class:`Hedger` is one iteration's state: a window of the latest take durations, measured in
the worker threads, and a token bucket that bounds the extra takes. :func:`race` runs one attempt
on the event loop: the take, and once it is late (and the bucket allows) its hedge beside it.

Whichever finishes first finishes the item's :class:`~lance_prefetch.schedule._slots.Slot`; a slot keeps
the first result only, so the other take's rows are never delivered (nor processed: the
prefetcher drops them before conversion) and no row is read twice into a batch. The loser cannot
be interrupted (a Lance ``take`` keeps going): it is abandoned and finishes in its thread.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import numpy as np

from lance_prefetch._validate import check_int

__all__ = ["HedgePolicy", "Hedger", "WINDOW", "check_hedge", "race", "resolve_hedge"]

#: How many of the latest take durations (of one iteration) the hedge delay is computed from.
WINDOW = 256
#: The most hedge tokens the bucket holds: at most this many hedges in a burst.
BURST = 2.0


@dataclass(frozen=True, kw_only=True)
class HedgePolicy:
    """When a slow ``take`` gets a second, identical ``take`` (a hedge), and how many at most.

    A take still running after the hedge delay is read a second time, in a thread of its own
    beside the first (on the first's ``max_in_flight`` slot, within the same ``retry.timeout``);
    the first of the two to return is used, the other is abandoned and its rows dropped, so
    batches keep their rows, their order and come out exactly once. The delay is the larger of
    the ``percentile``-th percentile of the iteration's latest 256 take durations and
    ``min_slowdown`` times their median; no take is hedged before ``min_samples`` takes have
    returned.

    The extra takes are bounded by a token bucket: each take started earns ``budget`` of a
    token, a hedge spends one, the bucket holds at most 2 and starts empty. Hence, in every
    iteration, hedges issued ``<= budget`` x takes started, at any moment.

    Hedging cuts the latency of rare stalls (a take several times slower than most, e.g. a
    request stuck behind a slow server); it cannot shorten takes that are all slow alike. On an
    object store a random ``take`` issues about one request per row, so a request tail touching
    most takes moves the median itself; the ``min_slowdown`` floor then keeps hedges from firing
    (``docs/benchmarks.md``).

    Args:
        percentile (float): the percentile of recent take durations a take must run past, in
            ``[50, 100)``. Default: ``95.0``.
        min_slowdown (float): it must also run past this many times their median, ``>= 1``.
            Default: ``2.0``.
        budget (float): hedges per take started, at most, in ``(0, 1]``. Default: ``0.05``.
        min_samples (int): take durations measured before any hedge, ``>= 2``. Default: ``20``.

    Raises:
        TypeError, ValueError: a field has the wrong type or is out of range (the message names
            it).
    """

    percentile: float = 95.0
    min_slowdown: float = 2.0
    budget: float = 0.05
    min_samples: int = 20

    def __post_init__(self) -> None:
        _check_number("percentile", self.percentile, lambda v: 50 <= v < 100, "in [50, 100)")
        _check_number("min_slowdown", self.min_slowdown, lambda v: v >= 1, ">= 1")
        _check_number("budget", self.budget, lambda v: 0 < v <= 1, "in (0, 1]")
        check_int("min_samples", self.min_samples, minimum=2)


def _check_number(name: str, value: Any, in_range: Callable[[float], bool], bounds: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} should be a number, but got {name}={value!r}")
    if not (math.isfinite(value) and in_range(value)):
        raise ValueError(f"{name} should be {bounds}, but got {name}={value!r}")


def check_hedge(hedge: Any) -> HedgePolicy | str | None:
    """``hedge`` as a loader takes it: ``"auto"``, ``None`` or a :class:`HedgePolicy`.

    Raises:
        TypeError: anything else (``True``/``False`` included: the message says what to pass).
    """
    if hedge is None or hedge == "auto" or isinstance(hedge, HedgePolicy):
        return hedge  # type: ignore[no-any-return]
    raise TypeError(
        f"hedge should be 'auto' (hedged takes on object stores), None (never) or a "
        f"lance_prefetch.HedgePolicy, but got hedge={hedge!r}; e.g. hedge=HedgePolicy() to hedge "
        f"on local files too, or hedge=None to turn it off"
    )


def resolve_hedge(hedge: HedgePolicy | str | None, *, remote: bool) -> HedgePolicy | None:
    """The policy an iteration runs: ``"auto"`` is :class:`HedgePolicy()` on an object store
    (``remote``), ``None`` on local files (a local take's duration follows its size and the
    CPU, where a second take only competes with the first)."""
    if hedge == "auto":
        return HedgePolicy() if remote else None
    return hedge  # type: ignore[return-value]


class Hedger:
    """One iteration's hedging state: recent take durations, the token bucket, the counts.

    :meth:`observe` is called from worker threads, the rest from the event loop (and
    :meth:`counts` from any thread); a lock guards the window and the counts.

    Args:
        policy (HedgePolicy): the rules.
    """

    def __init__(self, policy: HedgePolicy) -> None:
        self.policy = policy
        self._durations: deque[float] = deque(maxlen=WINDOW)
        self._units = 0  # the batches of the largest take observed: the window's takes
        self._lock = threading.Lock()
        self._tokens = 0.0  # the bucket starts empty: hedges <= budget x takes, always
        self.started = 0  # takes started (hedges not included)
        self.issued = 0  # hedges started
        self.won = 0  # hedges whose rows were used

    def observe(self, seconds: float, units: int = 1) -> None:
        """A take of ``units`` batches returned after ``seconds`` (a loser's late return counts
        too: it is real). Only the largest takes seen so far are kept: an iteration's first,
        smaller takes (its ramp) and its last one would pull the threshold down."""
        with self._lock:
            if units > self._units:
                self._units = units
                self._durations.clear()
            if units == self._units:
                self._durations.append(seconds)

    def delay(self) -> float | None:
        """Seconds after which a take starting now gets a hedge; ``None`` (no hedge) until
        ``min_samples`` durations are known."""
        with self._lock:
            if len(self._durations) < self.policy.min_samples:
                return None
            durations = np.fromiter(self._durations, float, len(self._durations))
        high, median = np.percentile(durations, [self.policy.percentile, 50.0])
        return float(max(high, self.policy.min_slowdown * median))

    def start(self) -> None:
        """A take (not a hedge) starts: the bucket earns ``budget`` of a token."""
        self.started += 1
        self._tokens = min(self._tokens + self.policy.budget, BURST)

    def spend(self) -> bool:
        """Whether a hedge may start now (a whole token was there; it is spent)."""
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        with self._lock:
            self.issued += 1
        return True

    def record_win(self) -> None:
        """A hedge's rows were used (from a worker thread)."""
        with self._lock:
            self.won += 1

    def counts(self) -> tuple[int, int]:
        """(hedges issued, hedges won) so far."""
        with self._lock:
            return self.issued, self.won


async def race(
    attempt: Callable[[bool], Awaitable[Exception | None]],
    hedger: Hedger | None,
    settled: Callable[[], bool],
) -> Exception | None:
    """One attempt, hedged: ``attempt(False)``, and ``attempt(True)`` beside it once the first
    ran past :meth:`Hedger.delay` while ``settled()`` is false and the bucket allows.

    ``attempt(hedge)`` runs one take and returns ``None`` once its result finished (or will
    finish) the item, else its error. The first ``None`` ends the race: the other take is
    cancelled (abandoned in its thread). Returns ``None`` if either take succeeded, else the
    first error to arrive once every take started has failed. Cancelling the caller cancels both.
    """
    delay = None if hedger is None else hedger.delay()
    if hedger is not None:
        hedger.start()
    if delay is None:
        return await attempt(False)
    errors: list[Exception] = []
    running = 0
    succeeded = False

    async with anyio.create_task_group() as group:

        async def run(hedge: bool) -> None:
            nonlocal running, succeeded
            running += 1
            error = await attempt(hedge)
            running -= 1
            if error is None:
                succeeded = True
            else:
                errors.append(error)
            if succeeded or running == 0:  # won, or nothing left to wait for
                group.cancel_scope.cancel()

        async def hedge_when_late() -> None:
            await anyio.sleep(delay)
            if running and not settled() and hedger.spend():  # type: ignore[union-attr]
                group.start_soon(run, True, name="hedge")

        group.start_soon(run, False, name="take")
        group.start_soon(hedge_when_late, name="hedge timer")
    return None if succeeded else errors[0]
