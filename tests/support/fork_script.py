"""Forking a process that uses a loader, for tests/test_fork.py.

Usage: ``python fork_script.py URI``. Reads a real Lance dataset (``id`` = offset) in this order,
printing one line ``STEP {json}`` per step (times in seconds):

1. ``os_fork``: three batches of epoch 0 are read and the iterator stays live (its event-loop
   thread runs, reads may be in flight); ``os.fork()``. The child calls ``next()`` on the
   inherited iterator, then ``iter(loader)``, prints what each raised as a ``CHILD {json}`` line and
   exits through normal interpreter shutdown (``sys.exit(0)``). The parent waits for it (killing it
   after 60 s): its exit code and how long it took.
2. ``live_fork_dataloader``: with that iterator still live, a DataLoader with a ``fork`` worker is
   iterated: its error and how long it took.
3. ``parent_rest``: the parent reads the rest of epoch 0 from its iterator: the ids of the whole
   epoch, and the plan's.
4. ``dropped_fork_dataloader``: a ``for`` loop breaks after one batch of epoch 1 (the iterator is
   dropped, its thread stops), then the same ``fork`` DataLoader as in step 2.
5. ``after``: ``list(loader)`` in the parent: the epoch it read and whether it matches the plan.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from torch.utils.data import DataLoader

from lance_prefetch import PrefetchLoader, ReadOptions
from lance_prefetch.schedule._blocking import THREAD_NAME
from support.helpers import child_exit_code  # tests/ is on PYTHONPATH (checkout_env)


def emit(prefix: str, record: dict) -> None:
    os.write(1, (prefix + " " + json.dumps(record) + "\n").encode())


def loop_threads() -> int:
    return sum(t.name == THREAD_NAME and t.is_alive() for t in threading.enumerate())


def plan_ids(loader: PrefetchLoader, epoch: int) -> list[list[int]]:
    return [b.indices.tolist() for b in loader.epoch_plan(epoch).rank_batches(loader.rank)]


def fork_dataloader(loader: PrefetchLoader) -> dict:
    """Iterate a DataLoader with a fork worker: the error and how long it took to come. (The
    failed DataLoader iterator is left to the interpreter's exit: stopping it now would take 5 s,
    torch's wait for a worker whose ``iter()`` failed, the same for any IterableDataset.)"""
    data = DataLoader(loader, batch_size=None, num_workers=1, multiprocessing_context="fork")
    start = time.monotonic()
    try:
        record = {"error": None, "batches": sum(1 for _ in data)}
    except Exception as exc:  # the error the training loop sees
        record = {"error": type(exc).__name__, "message": str(exc)}
    record["s"] = time.monotonic() - start
    return record


def child(loader: PrefetchLoader, iterator) -> None:
    record = {}
    for name, call in (("next", lambda: next(iterator)), ("iter", lambda: iter(loader))):
        start = time.monotonic()
        try:
            call()
            record[name] = {"error": None}
        except Exception as exc:
            record[name] = {"error": type(exc).__name__, "message": str(exc)}
        record[name]["s"] = time.monotonic() - start
    record["loop_threads"] = loop_threads()
    emit("CHILD", record)
    sys.exit(0)  # normal interpreter shutdown, atexit hooks included


def main() -> None:
    loader = PrefetchLoader(
        sys.argv[1], 10, columns=["id"], readahead=8, read=ReadOptions(max_in_flight=4)
    )
    iterator = iter(loader)
    seen = [next(iterator)["id"].tolist() for _ in range(3)]

    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        child(loader, iterator)
    code = child_exit_code(pid, timeout=60)
    emit("STEP", {"step": "os_fork", "exit_code": code, "s": time.monotonic() - start})

    emit(
        "STEP",
        {"step": "live_fork_dataloader", "loop_threads": loop_threads()} | fork_dataloader(loader),
    )

    seen += [batch["id"].tolist() for batch in iterator]
    emit("STEP", {"step": "parent_rest", "ids": seen, "plan": plan_ids(loader, 0)})

    for _ in loader:
        break
    emit(
        "STEP",
        {"step": "dropped_fork_dataloader", "epoch": loader.epoch, "loop_threads": loop_threads()}
        | fork_dataloader(loader),
    )

    after = [batch["id"].tolist() for batch in loader]
    emit(
        "STEP",
        {
            "step": "after",
            "epoch": loader.epoch,
            "matches_plan": after == plan_ids(loader, loader.epoch),
        },
    )


if __name__ == "__main__":
    main()
