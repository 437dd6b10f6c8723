"""Helpers shared by the tests (import as ``from support.helpers import ...``)."""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import signal
import threading
import time

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from lance_prefetch import PrefetchLoader
from lance_prefetch.schedule._blocking import THREAD_NAME

#: The multiprocessing context most tests start DataLoader workers in: ``forkserver``, preloaded
#: with torch, numpy and pyarrow (not Lance: a forkserver that imported Lance gave workers that
#: stalled for seconds). Like ``spawn`` (which the README, the examples and a few tests use as it
#: is), every worker is a process that never opened a dataset: the loader arrives pickled and
#: opens it anew; but a worker forks from the warm server instead of importing torch for seconds.
#: The server starts once per test process, with that process's ``sys.path`` and environment (a
#: variable set later by a test does not reach its workers).
WORKERS = multiprocessing.get_context("forkserver")
WORKERS.set_forkserver_preload(["torch", "torch.utils.data", "numpy", "pyarrow", "anyio"])

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


def epoch_sequence(seed: int, epoch: int) -> np.random.SeedSequence:
    """The ``SeedSequence`` of epoch ``epoch``'s permutation as ``lance_prefetch.plan.sampling``'s
    docstring ("Seeds") states it, computed here without the library: the ``uint32`` words
    ``[seed lo, seed hi, 0, 0, 0x45504F43, epoch lo, epoch hi]``."""
    low, high = 0xFFFFFFFF, 32
    words = [seed & low, seed >> high, 0, 0, 0x45504F43, epoch & low, epoch >> high]
    return np.random.SeedSequence(np.array(words, dtype=np.uint32))


@contextlib.contextmanager
def stopping(dataloader):
    """``iter(dataloader)``, whose worker processes are stopped when the block ends, also on an
    error. An iterator whose workers raised is kept alive by the error's traceback, and when the
    garbage collector frees it later (during some other test) torch waits up to 5 s per worker
    to stop them."""
    iterator = iter(dataloader)
    try:
        yield iterator
    finally:
        iterator._shutdown_workers()


def checkout_env() -> dict[str, str]:
    """The environment for a Python subprocess that imports this checkout's lance_prefetch (and
    the test support modules, as ``support.*``): the checkout's root and ``tests/`` first on
    ``PYTHONPATH``."""
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    root = os.path.dirname(tests)
    path = os.pathsep.join(filter(None, [root, tests, os.environ.get("PYTHONPATH")]))
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
    loader: PrefetchLoader, num_workers: int = 0, *, epoch: int | None = None, context=WORKERS
) -> list[list[int]]:
    """Every batch's ids, read directly (``num_workers=0``) or through DataLoader workers (started
    in ``context``, default :data:`WORKERS`);
    ``epoch``: call ``set_epoch(epoch)`` first (else the loader's own rules pick the epoch)."""
    if epoch is not None:
        loader.set_epoch(epoch)
    if num_workers == 0:
        return batch_ids(loader)
    data_loader = DataLoader(
        loader, batch_size=None, num_workers=num_workers, multiprocessing_context=context
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


def read_until_failure(
    loader, after: int, fault
) -> tuple[list[list[int]], BaseException, float, float]:
    """Iterate ``loader`` collecting each batch's ids; after ``after`` batches call ``fault()``;
    the iteration must then end with ``BatchLoadError``. Returns the ids read, the error, and the
    ``time.monotonic()`` times at which ``fault()`` began and returned."""
    from lance_prefetch import BatchLoadError

    received: list[list[int]] = []
    began = returned = float("nan")
    with pytest.raises(BatchLoadError) as caught:
        for batch in loader:
            received.append(batch["id"].tolist())
            if len(received) == after:
                began = time.monotonic()
                fault()
                returned = time.monotonic()
    return received, caught.value, began, returned


def wait_until(condition, timeout: float = 5.0) -> bool:
    """Poll ``condition()`` every 10 ms until true or ``timeout`` seconds passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def collect_until(condition, timeout: float = 5.0) -> bool:
    """:func:`wait_until` with a ``gc.collect()`` before each poll: ``gc.collect()`` returns at
    once, collecting nothing, while an automatic collection runs on another thread (one of a
    loader's), so a single call may leave a reference cycle standing."""
    return wait_until(lambda: gc.collect() >= 0 and condition(), timeout)


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


class StallOn:
    """A transform (picklable into spawn workers) that adds to each batch the pid of the process
    that read it, and sleeps ``seconds`` before a batch holding the id ``stall_id``: a worker
    stuck there, mid-epoch, with everything it read before handed over."""

    def __init__(self, stall_id: int, seconds: float = 120.0) -> None:
        self.stall_id, self.seconds = stall_id, seconds

    def __call__(self, batch: dict) -> dict:
        if bool((batch["id"] == self.stall_id).any()):
            time.sleep(self.seconds)
        batch["pid"] = torch.tensor([os.getpid()])
        return batch
