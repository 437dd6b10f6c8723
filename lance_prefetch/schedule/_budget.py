"""The readahead budget of one producer: tokens taken before a read starts, given back as the
consumer receives what was read.

The producer (on the event loop) takes an item's tokens with :meth:`ReadaheadBudget.acquire`
before its fetch starts; the consumer (the training thread) gives them back with
:meth:`ReadaheadBudget.release` as it hands the item's units on. A returned token travels to the
loop with ``call_soon_threadsafe``, without waiting, and in bunches as large as the largest item:
each trip wakes the event-loop thread and costs the consumer a GIL hand-over.
"""

from __future__ import annotations

import asyncio
import contextlib

import anyio

__all__ = ["ReadaheadBudget"]


class ReadaheadBudget:
    """``readahead`` tokens shared by the producer (event loop) and one consumer thread.

    Invariant (on the loop): ``tokens.value + held + debt == readahead``, where ``held`` counts
    the units taken and not yet given back to the loop and ``debt`` what a shrinking
    :meth:`resize` took away that returned tokens have not repaid yet. The consumer's ``owed``
    (released, not yet sent) counts in ``held`` until it is sent.

    Args:
        readahead (int): tokens, ``>= 1`` (checked by the caller).
    """

    def __init__(self, readahead: int) -> None:
        self.readahead = readahead
        self.largest = 1  # the most units of one item so far; written by the producer only
        self._debt = 0  # on the loop only
        self._owed = 0  # the consumer's only
        self._tokens: anyio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def open(self) -> None:
        """Create the tokens, on the running event loop (once, before the first acquire)."""
        self._loop = asyncio.get_running_loop()
        self._tokens = anyio.Semaphore(self.readahead)

    async def acquire(self, units: int = 1) -> None:
        """Take ``units`` tokens, waiting for each (producer side)."""
        for _ in range(units):
            await self._tokens.acquire()  # type: ignore[union-attr]

    def note(self, units: int) -> None:
        """An item of ``units`` units was started (producer side)."""
        self.largest = max(self.largest, units)

    def release(self, units: int) -> None:
        """Give back ``units`` tokens (consumer side); sent to the loop once they make up the
        largest item, since the producer cannot start one with fewer."""
        self._owed += units
        if self._owed >= self.largest:
            self.flush()

    def flush(self) -> None:
        """Send every token released and not yet sent (consumer side, before it waits)."""
        owed, self._owed = self._owed, 0
        if owed and self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody needs them
                self._loop.call_soon_threadsafe(self._repay, owed)

    def resize(self, readahead: int) -> None:
        """On the loop: ``readahead`` tokens from now on; growing takes effect at once, shrinking
        withholds returned tokens until the new bound holds."""
        change, self.readahead = readahead - self.readahead, readahead
        if change < 0:
            self._debt -= change
        else:
            self._repay(change)

    def _repay(self, units: int) -> None:
        """On the loop: tokens back to the producer, first repaying a shrink's debt."""
        paid = min(units, self._debt)
        self._debt -= paid
        for _ in range(units - paid):
            self._tokens.release()  # type: ignore[union-attr]
