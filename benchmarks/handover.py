"""What handing a batch to the training thread costs, measured on this machine.

Two designs, with a fetch that does no work so only the hand-over is timed:

* ``portal``: the training thread asks the event loop for each item with a blocking anyio portal
  call (``portal.call(prefetcher.__anext__)``-style), a round trip through the loop per item.
* ``lance-prefetch``: :class:`~lance_prefetch.schedule._blocking.BlockingPrefetcher`; the worker thread
  hands the result over by releasing a lock and the training thread returns the readahead
  token without waiting (``call_soon_threadsafe``).

For each it reports the mean time the training thread spends in ``next()`` while it "trains" for
``--step-ms`` per item (the prefetcher is then ahead, so this is the pure hand-over cost), and the
pipeline's capacity in items/s with no training step. Run::

    .venv/bin/python benchmarks/handover.py [--items 2000] [--step-ms 2]
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Iterator

import anyio
import anyio.from_thread

from lance_prefetch.schedule._blocking import BlockingPrefetcher
from lance_prefetch.schedule._prefetcher import Prefetcher


def portal_items(items: int) -> Iterator[int]:
    async def one() -> int:
        return 1

    with anyio.from_thread.start_blocking_portal("asyncio") as portal:
        for _ in range(items):
            yield portal.call(one)


def prefetcher_items(items: int) -> Iterator[int]:
    return BlockingPrefetcher(Prefetcher(range(items), int, readahead=8, max_in_flight=4))


def measure(make, items: int, step_s: float) -> tuple[float, float]:
    """(mean microseconds inside next(), items per second overall)."""
    iterator = iter(make(items))
    waited = 0.0
    start = time.perf_counter()
    while True:
        before = time.perf_counter()
        if next(iterator, None) is None:
            break
        waited += time.perf_counter() - before
        if step_s:
            time.sleep(step_s)
    return waited / items * 1e6, items / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--step-ms", type=float, default=2.0)
    args = parser.parse_args()
    print(f"{platform.machine()}, Python {platform.python_version()}, {args.items} items")
    print("| design | in next() with a step, us | capacity without a step, items/s |")
    print("|---|---|---|")
    for name, make in (("portal", portal_items), ("lance-prefetch", prefetcher_items)):
        waited_us, _ = measure(make, args.items, args.step_ms / 1000)
        _, capacity = measure(make, args.items, 0.0)
        print(f"| {name} | {waited_us:.1f} | {capacity:,.0f} |")


if __name__ == "__main__":
    main()
