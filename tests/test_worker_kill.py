"""A DataLoader worker killed (SIGKILL) mid-epoch: torch's own worker error reaches the training
loop at once (no hang), no process is left, and a resume from the last StatefulDataLoader
checkpoint before the kill reads the rest of the epoch exactly."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
from support.helpers import (
    WORKERS,
    StallOn,
    batch_ids,
    stopping,
    stops_workers_mid_epoch,
    wait_until,
)
from torchdata.stateful_dataloader import StatefulDataLoader

from lance_prefetch import PrefetchLoader, ReadOptions, state_from_dataloader

#: The DataLoader's timeout: a batch that does not come within it fails the test, never hangs it
#: (spawn workers took up to 30 s to deliver their first batch on the loaded 2-core machine).
TIMEOUT_S = 60


@stops_workers_mid_epoch
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_worker_killed_mid_epoch_is_torchs_error_at_once_and_the_resume_is_exact(ids_1003):
    """2 spawn workers, 100 batches of 10: worker 0 stalls at batch 20 (after handing over its
    batches 0, 2, ..., 18) and is killed while the loop waits for it. torch's worker error comes
    within milliseconds (its SIGCHLD handler), both workers are gone, and the resume from the
    checkpoint taken at batch 16 redelivers batches 16-19 and the rest: with the 16 before, the
    epoch exactly, each batch once."""
    expected = [
        b.indices.tolist() for b in PrefetchLoader(ids_1003, 10).epoch_plan(0).rank_batches(0)
    ]
    stall = expected[20][0]
    # coalesce=1: a take a batch, so the batches before the stalled one are handed over
    loader = PrefetchLoader(
        ids_1003, 10, columns=["id"], transform=StallOn(stall), read=ReadOptions(coalesce=1)
    )
    children = {child.pid for child in psutil.Process().children(recursive=True)}
    dataloader = StatefulDataLoader(
        loader, batch_size=None, num_workers=2, multiprocessing_context="spawn", timeout=TIMEOUT_S
    )
    delivered, pids, saved = [], [], None
    with stopping(dataloader) as iterator:
        for _ in range(20):
            batch = next(iterator)
            delivered.append(batch["id"].tolist())
            pids.append(int(batch["pid"]))
            if len(delivered) % 4 == 0 and len(delivered) <= 16:
                saved = dataloader.state_dict()
        workers = pids[:2]
        assert pids == workers * 10 and workers[0] != workers[1]  # worker 0 read the even ones
        with pytest.raises(RuntimeError) as info:
            killed = time.monotonic()
            os.kill(pids[0], signal.SIGKILL)  # worker 0, stalled at batch 20
            next(iterator)
        waited = time.monotonic() - killed
    error = info.value
    killed_message = f"DataLoader worker (pid {pids[0]}) is killed by signal: Killed."
    assert killed_message in (str(error).strip(), str(error.__cause__).strip())
    assert str(error).strip() in (
        killed_message,
        f"DataLoader worker (pid(s) {pids[0]}) exited unexpectedly",
    )
    assert waited < 5, waited  # torch's SIGCHLD handler: milliseconds, not the timeout
    assert delivered == expected[:20]
    # torch stops the other worker (its own shutdown waits up to 5 s per worker, then kills)
    assert wait_until(lambda: not any(_running(pid) for pid in workers), timeout=30)
    left = {child.pid for child in psutil.Process().children(recursive=True)} - children
    assert left == set()
    assert state_from_dataloader(saved)["position"] == 16

    restored = StatefulDataLoader(
        PrefetchLoader(ids_1003, 10, columns=["id"]),
        batch_size=None,
        num_workers=2,
        multiprocessing_context=WORKERS,
        timeout=TIMEOUT_S,
    )
    restored.load_state_dict(saved)
    rest = batch_ids(restored)
    assert rest[:4] == delivered[16:20]  # delivered after the checkpoint: delivered again
    assert delivered[:16] + rest == expected


def _running(pid: int) -> bool:
    """``pid`` is a live process (not gone, not a zombie waiting to be reaped)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
