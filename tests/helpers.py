"""Helpers shared by the tests (import as ``from helpers import ...``)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch
from torch.utils.data import DataLoader

from lance_prefetch import PrefetchLoader
from lance_prefetch.scheduling import THREAD_NAME

#: Marks a test that checks exact batches: it runs once per read mode (``conftest.READ_MODES``:
#: coalesced takes, one take per batch, cache="memory", cache="disk").
exact = pytest.mark.usefixtures("read_mode")

#: Marks a test that stops DataLoader workers mid-epoch (``break`` out of non-persistent workers).
#: torch's own race: a worker told to stop can abort at exit ("terminate called without an active
#: exception") while its queue's feeder thread still pickles a batch nobody will read; the main
#: process reports it from ``_MultiProcessingDataLoaderIter.__del__`` as an ignored exception. A
#: plain ``IterableDataset`` without lance_prefetch does it too (in 10 of 120 DataLoaders broken off
#: under a CPU hog here), so such tests ignore that report; every batch they read is still checked.
stops_workers_mid_epoch = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <function _MultiProcessingDataLoaderIter.__del__"
    ":pytest.PytestUnraisableExceptionWarning"
)


def checkout_env() -> dict[str, str]:
    """The environment for a Python subprocess that imports this checkout's lance_prefetch (and
    the scripts in tests/): the checkout's root first on ``PYTHONPATH``."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path)


def batch_ids(batches) -> list[list[int]]:
    """The ``id`` column of each batch, as Python lists."""
    return [batch["id"].tolist() for batch in batches]


def expected_rank_ids(
    loader: PrefetchLoader, rank: int | None = None, *, epoch: int | None = None
) -> list[list[int]]:
    """What ``rank`` must see in ``epoch`` (default: the loader's current epoch), computed from the
    pure plan (id == row offset)."""
    plan = loader.epoch_plan(epoch)
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


def record_process(batch: dict) -> dict:
    """A transform (picklable into spawn workers) that adds to the batch the pid of the process
    that read it and the idents of that process's live event-loop threads."""
    batch["pid"] = torch.tensor([os.getpid()])
    batch["loops"] = torch.tensor(
        [t.ident for t in threading.enumerate() if t.name == THREAD_NAME and t.is_alive()]
    )
    return batch


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


class FlakySource:
    """Wraps a loader's ``LanceSource`` (``loader._source = FlakySource(loader._source, ...)``):
    the first attempt to read every ``every``-th distinct batch (in the order reads start) raises
    ``error`` (a Lance-style 503 by default) before reading, and its retry reads. ``always``:
    batches (offset arrays) whose every attempt raises. Pickles into workers, where each copy
    counts its own batches."""

    SLOW_DOWN = (
        "LanceError(IO): Generic S3 error: Error performing GET http://store/data/0.lance - "
        "Server returned non-2xx status code: 503 Service Unavailable: <Code>SlowDown</Code>"
    )

    def __init__(self, inner, every: int = 0, *, always=(), error: str = SLOW_DOWN):
        self.inner, self.every, self.error = inner, every, error
        self.always = {indices.tobytes() for indices in always}
        self.batches: dict[bytes, int] = {}  # offsets -> the batch's number, in first-seen order
        self.takes = 0
        self.failures = 0
        self.lock = threading.Lock()

    def take(self, indices):
        key = indices.tobytes()
        with self.lock:
            self.takes += 1
            first = key not in self.batches
            number = self.batches.setdefault(key, len(self.batches) + 1)
            fail = (first and self.every and number % self.every == 0) or key in self.always
            self.failures += fail
        if fail:
            raise OSError(self.error)
        return self.inner.take(indices)

    def __getstate__(self):
        state = self.__dict__.copy()
        del state["lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.lock = threading.Lock()

    def __getattr__(self, name):
        if name == "inner":  # while unpickling, before __dict__ is filled
            raise AttributeError(name)
        return getattr(self.inner, name)
