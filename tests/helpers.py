"""Helpers shared by the tests (import as ``from helpers import ...``)."""

from __future__ import annotations

import os
import signal
import threading
import time

from torch.utils.data import DataLoader

from lance_prefetch import PrefetchLoader
from lance_prefetch.scheduling import THREAD_NAME


def batch_ids(batches) -> list[list[int]]:
    """The ``id`` column of each batch, as Python lists."""
    return [batch["id"].tolist() for batch in batches]


def expected_rank_ids(loader: PrefetchLoader, rank: int | None = None) -> list[list[int]]:
    """What ``rank`` must see this epoch, computed from the pure plan (id == row offset)."""
    plan = loader.epoch_plan()
    rank = loader.rank if rank is None else rank
    return [batch.indices.tolist() for batch in plan.rank_batches(rank)]


def collect(
    loader: PrefetchLoader, num_workers: int = 0, *, epoch: int | None = None
) -> list[list[int]]:
    """Every batch's ids, read directly (``num_workers=0``) or through spawn DataLoader workers;
    ``epoch``: call ``set_epoch(epoch)`` first (else the loader's own rules pick the epoch)."""
    if epoch is not None:
        loader.set_epoch(epoch)
    if num_workers == 0:
        return batch_ids(loader)
    data_loader = DataLoader(
        loader, batch_size=None, num_workers=num_workers, multiprocessing_context="spawn"
    )
    return batch_ids(data_loader)


def loop_threads() -> list[threading.Thread]:
    """Live event-loop threads started by lance_prefetch in this process."""
    return [t for t in threading.enumerate() if t.name == THREAD_NAME and t.is_alive()]


def wait_until(condition, timeout: float = 5.0) -> bool:
    """Poll ``condition()`` every 10 ms until true or ``timeout`` seconds passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def child_exit_code(pid: int, timeout: float = 10.0) -> int | None:
    """Wait for forked child ``pid``; its exit code, or ``None`` (after killing it) on a hang."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None
