"""Iterators started and dropped back to back while interrupts land anywhere, for
tests/test_interrupts.py.

Usage: ``python interrupt_script.py MODE SECONDS``. Prints ``ready`` once warm, then loops for at
most SECONDS (no Lance: the fetch is a cheap fake, so the loop spends its time starting and
stopping iterators):

- ``sigint``: ``it = BlockingPrefetcher(...); next(it); del it`` until the test sends SIGINT; the
  ``KeyboardInterrupt`` is left uncaught (exit by SIGINT). Most of the loop's time is spent in the
  windows where an iterator starts its event-loop thread or is closed by garbage collection.
- ``alarm``: a ``SIGALRM`` handler raises ``KeyboardInterrupt`` at a random moment (0.05-3 ms)
  while ``next()`` runs, over and over (``ALARM_ITERATIONS`` iterators, or SECONDS if that comes
  first); each interrupted iterator is then closed explicitly (which
  must return: its event-loop thread must not hang on a lock the interrupt left held). Prints one
  line ``RESULT {json}`` with the counts of iterations, interrupts, batches and interrupts lost
  (landed in a weakref callback or finalizer, where Python ignores them), and the event-loop
  threads still alive.
"""

from __future__ import annotations

import json
import random
import signal
import sys
import threading
import time

from lance_prefetch.schedule._blocking import THREAD_NAME, BlockingPrefetcher
from lance_prefetch.schedule._prefetcher import Prefetcher


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def fetch(item: int) -> int:
    return item


def sigint(seconds: float) -> None:
    iterator = BlockingPrefetcher(Prefetcher(range(4), fetch, readahead=2, max_in_flight=1))
    next(iterator)
    del iterator
    say("ready")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        iterator = BlockingPrefetcher(Prefetcher(range(4), fetch, readahead=2, max_in_flight=1))
        next(iterator)
        del iterator
    say("no SIGINT came")


#: Iterators the ``alarm`` mode starts (a number, not a duration: a busy machine runs fewer a second).
ALARM_ITERATIONS = 300


def alarm(seconds: float) -> None:
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGALRM, interrupt)
    counts = {"iterations": 0, "interrupts": 0, "batches": 0, "lost": 0}
    rng = random.Random(0)
    say("ready")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and counts["iterations"] < ALARM_ITERATIONS:
        iterator = BlockingPrefetcher(Prefetcher(range(10**9), fetch, readahead=4, max_in_flight=2))
        counts["iterations"] += 1
        try:
            signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.00005, 0.003))
            armed = time.monotonic()
            for _ in iterator:
                counts["batches"] += 1
                if time.monotonic() - armed > 0.5:
                    # the interrupt landed where Python prints "Exception ignored" and drops it
                    # (a weakref callback, a finalizer): plain Python, not the iterator's doing
                    counts["lost"] += 1
                    break
        except KeyboardInterrupt:
            counts["interrupts"] += 1
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        iterator.close()  # hangs if the interrupt left a lock held that the loop thread needs
    alive = [t.name for t in threading.enumerate() if t.name == THREAD_NAME and t.is_alive()]
    say("RESULT " + json.dumps({**counts, "loop_threads": alive}))


if __name__ == "__main__":
    {"sigint": sigint, "alarm": alarm}[sys.argv[1]](float(sys.argv[2]))
