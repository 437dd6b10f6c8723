"""A training script whose take of batch 2 never returns in time, for tests/test_lifecycle.py.

Usage: ``python stuck_take.py URI MODE``. The dataset's ``take`` is replaced (through
:func:`support.sources.tapped`) by a fake that builds the ``id`` column from the offsets (``id`` =
offset, as in the test datasets) without calling Lance, so no thread ever runs a Lance ``take``
here. With ``readahead=8, max_in_flight=4``, the take of the
epoch's batch 2 blocks for 60 s and those of batches 3, 4 and 5 for 3 s, so takes 6 and 7 are
pending (waiting for an in-flight slot) when the loop lets go; closing must cancel them, so they
never start, though slots free up while close() waits for the stuck take. MODE is how the
training loop lets go of its iterator while the takes 2..5 run:

- ``break``: ``break`` after batch 0 (the ``for`` loop drops the iterator);
- ``raise``: the training step raises after batch 0 (uncaught: exit code 1);
- ``close``: ``loader.close()`` after batch 0, the iterator still referenced;
- ``with``: leaving ``with loader:`` after batch 0, the iterator still referenced;
- ``gc``: the iterator, in a reference cycle, is dropped after batch 0 and ``gc.collect()`` runs;
- ``sigint-step``: prints ``step`` and sleeps in the training step; the test sends SIGINT;
- ``sigint-next``: reads batch 1 too, prints ``blocked`` and calls ``next()`` for batch 2, which
  waits for the stuck take; the test sends SIGINT (once, or twice).

An ``atexit`` hook registered before lance_prefetch is imported (so it runs after lance_prefetch's
own, which waits for reads still running) prints one line ``RESULT {json}``: ``start``, the
script's start on the system-wide ``time.monotonic()`` clock, and times in seconds from it:
``trigger`` (the loop lets go, or the first SIGINT arrives; ``sigints`` lists every SIGINT),
``loop_gone`` (the event-loop thread was first seen gone, polled every 2 ms), ``released`` (the
statement that let go returned, or the uncaught error's traceback is printed), ``exit`` (the hook
runs); the ids delivered, the positions whose take started (``takes``, in order) and the Python
threads alive at exit (name, daemon).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import threading
import time
import weakref

START = time.monotonic()
RESULT: dict = {"mode": sys.argv[2], "pid": os.getpid(), "start": START}


def now() -> float:
    return round(time.monotonic() - START, 4)


def report() -> None:
    RESULT["exit"] = now()
    RESULT["threads"] = [[t.name, t.daemon] for t in threading.enumerate()]
    sys.stdout.write("RESULT " + json.dumps(RESULT) + "\n")
    sys.stdout.flush()


atexit.register(report)  # before lance_prefetch registers its hook: runs after it

import pyarrow as pa  # noqa: E402

from lance_prefetch import PrefetchLoader, ReadOptions  # noqa: E402
from lance_prefetch.schedule._blocking import THREAD_NAME  # noqa: E402
from support.helpers import collect_until  # noqa: E402
from support.sources import tapped  # noqa: E402


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def loop_alive() -> bool:
    return any(t.name == THREAD_NAME and t.is_alive() for t in threading.enumerate())


def watch_loop_thread() -> None:
    """Record when the event-loop thread is first seen gone after it was seen alive."""
    while not loop_alive():
        time.sleep(0.002)
    while loop_alive():
        time.sleep(0.002)
    RESULT["loop_gone"] = now()


def on_uncaught(kind, value, traceback):
    RESULT["released"] = now()  # the error reaches the user: its traceback is printed
    sys.__excepthook__(kind, value, traceback)


sys.excepthook = on_uncaught


def on_sigint(signum, frame):
    RESULT.setdefault("sigints", []).append(now())
    RESULT.setdefault("trigger", now())
    signal.default_int_handler(signum, frame)


signal.signal(signal.SIGINT, on_sigint)

with tapped() as TAP:
    loader = PrefetchLoader(
        sys.argv[1], 10, columns=["id"], readahead=8, read=ReadOptions(max_in_flight=4, coalesce=1)
    )  # one take per batch: the takes of batches 2..5 are the ones held
PLAN = loader.epoch_plan()
POSITION = {tuple(PLAN.batch(p).indices.tolist()): p for p in range(PLAN.batches_per_rank)}
DELAYS = {2: 60.0, 3: 3.0, 4: 3.0, 5: 3.0}  # 2 is stuck; 3..5 are slow, then 6.. wait their turn
started: list[int] = []
RESULT["takes"] = started  # the batch positions whose take started, in order
STUCK = threading.Event()  # set once the takes 2..5 all run


def fake_take(read, indices):
    position = POSITION[tuple(indices.tolist())]
    started.append(position)
    if set(DELAYS) <= set(started):
        STUCK.set()
    time.sleep(DELAYS.get(position, 0.0))  # 2: a read stuck in I/O; nothing can interrupt it
    return pa.table({"id": pa.array(indices, pa.int64())})


TAP.take = fake_take
threading.Thread(target=watch_loop_thread, name="watcher", daemon=True).start()
mode = RESULT["mode"]
delivered: list[list[int]] = []
RESULT["delivered"] = delivered


def wait_for_the_stuck_take() -> None:
    """Until takes 2..5 run (every in-flight slot is taken; takes 6 and 7 wait for one)."""
    STUCK.wait()


def first_batch(iterator) -> None:
    delivered.append(next(iterator)["id"].tolist())
    wait_for_the_stuck_take()


if mode in ("break", "raise", "sigint-step"):
    for batch in loader:
        delivered.append(batch["id"].tolist())
        wait_for_the_stuck_take()
        if mode == "sigint-step":
            say("step")
            time.sleep(30)  # a long training step, interrupted by Ctrl-C
        RESULT["trigger"] = now()
        if mode == "raise":
            raise ValueError("the training step failed")
        break
    RESULT["released"] = now()
elif mode == "sigint-next":
    iterator = iter(loader)
    first_batch(iterator)
    delivered.append(next(iterator)["id"].tolist())
    say("blocked")
    next(iterator)  # waits for the stuck take until SIGINT
elif mode == "close":
    iterator = iter(loader)
    first_batch(iterator)
    RESULT["trigger"] = now()
    loader.close()
    RESULT["released"] = now()
    RESULT["closed"] = iterator.closed
elif mode == "with":
    with loader:
        iterator = iter(loader)
        first_batch(iterator)
        RESULT["trigger"] = now()
    RESULT["released"] = now()
    RESULT["closed"] = iterator.closed
elif mode == "gc":
    iterator = iter(loader)
    first_batch(iterator)
    cycle = [iterator]
    cycle.append(cycle)
    freed = weakref.ref(iterator)
    RESULT["trigger"] = now()
    del iterator, cycle
    # gc.collect() collects nothing while an automatic collection runs on one of the loader's
    # threads: collect until the iterator is freed
    collect_until(lambda: freed() is None)
    RESULT["released"] = now()
else:
    raise SystemExit(f"unknown mode {mode!r}")
