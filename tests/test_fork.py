"""Processes: a loader used before ``fork`` refuses clearly in the child; spawn workers own threads.

The event-loop thread of an iterator lives in the process that called ``iter()``. ``fork`` copies
only the calling thread, so a forked child must refuse the parent's loader and iterators at once
(never hang on threads that are not there), and the parent must carry on unharmed. Spawned
DataLoader workers start their own loop thread each, and the main process starts none.

The fork cases run ``fork_script.py`` in a subprocess with a hard timeout, so a hang fails the test
instead of the run; the spawn cases bound every batch with the DataLoader's own ``timeout``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.helpers import (
    WORKERS,
    batch_ids,
    checkout_env,
    expected_rank_ids,
    loop_threads,
    record_process,
    stops_workers_mid_epoch,
)
from torch.utils.data import DataLoader

from lance_prefetch import PrefetchLoader

HERE = Path(__file__).parent
SPAWN_MESSAGE = "Use DataLoader(..., multiprocessing_context='spawn') (or 'forkserver')"


def run_python(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run a Python script in a subprocess that imports this checkout's lance_prefetch."""
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=checkout_env(),
    )


def records(stdout: str, prefix: str) -> list[dict]:
    start = len(prefix) + 1
    return [
        json.loads(line[start:]) for line in stdout.splitlines() if line.startswith(prefix + " ")
    ]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_loader_used_before_fork_refuses_in_the_child_and_the_parent_carries_on(ids_1003):
    """fork DataLoader workers, with the parent's iterator live and after it was dropped, fail at
    once naming spawn; a child of ``os.fork()`` gets a clear error from ``next()`` on the inherited
    iterator and from ``iter(loader)``, then exits normally; the parent's iterator still delivers
    the rest of its epoch, exactly."""
    result = run_python(str(HERE / "support" / "fork_script.py"), ids_1003, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "terminate called" not in result.stderr
    assert "Fatal Python error" not in result.stderr
    steps = {record.pop("step"): record for record in records(result.stdout, "STEP")}
    assert list(steps) == [
        "os_fork",
        "live_fork_dataloader",
        "parent_rest",
        "dropped_fork_dataloader",
        "after",
    ]

    for name, loops in (("live_fork_dataloader", 1), ("dropped_fork_dataloader", 0)):
        step = steps[name]
        assert step["loop_threads"] == loops  # the parent's loop thread exists, or not, at fork
        assert step["error"] == "RuntimeError", step
        assert step["message"].startswith("Caught RuntimeError in DataLoader worker process ")
        assert "forked from it; Lance is not fork-safe" in step["message"]
        assert SPAWN_MESSAGE in step["message"]
        assert step["s"] < 10, step  # at once: no read was attempted in the workers

    (child,) = records(result.stdout, "CHILD")
    assert child["next"]["error"] == "RuntimeError"
    assert child["next"]["message"].endswith(
        "by fork; its threads stayed behind. Start a new iterator here"
    )
    assert child["iter"]["error"] == "RuntimeError"
    assert child["iter"]["message"].endswith(SPAWN_MESSAGE)
    assert child["next"]["s"] < 1 and child["iter"]["s"] < 1
    assert child["loop_threads"] == 0  # fork copied only the calling thread
    assert steps["os_fork"]["exit_code"] == 0  # normal interpreter shutdown in the child, no hang

    rest = steps["parent_rest"]
    assert rest["ids"] == rest["plan"] and len(rest["ids"]) == 100
    assert steps["after"] == {"epoch": 2, "matches_plan": True}


def read(data: DataLoader, stop_after: int | None = None) -> tuple[list[dict], list[int]]:
    """The batches of one iteration of ``data`` (the first ``stop_after``, then ``break``), and the
    number of event-loop threads of this process seen at each batch."""
    batches, main_loops = [], []
    for batch in data:
        batches.append(batch)
        main_loops.append(len(loop_threads()))
        if len(batches) == stop_after:
            break
    return batches, main_loops


def owners(batches: list[dict]) -> list[tuple[int, tuple[int, ...]]]:
    """(pid, event-loop thread idents) of the process that read each batch."""
    return [(int(b["pid"]), tuple(b["loops"].tolist())) for b in batches]


def check_one_loop_per_worker(batches: list[dict], num_workers: int) -> list[int]:
    """Batch ``i`` comes from worker ``i % num_workers``, another process than this one, which has
    exactly one live event-loop thread, the same for all its batches. Returns the workers' pids."""
    seen = owners(batches)
    pids = [pid for pid, _ in seen[:num_workers]]
    assert len(set(pids)) == num_workers and os.getpid() not in pids
    for i, (pid, loops) in enumerate(seen):
        assert pid == pids[i % num_workers]
        assert len(loops) == 1, (i, pid, loops)
        assert loops == seen[i % num_workers][1]
    return pids


@pytest.mark.slow
def test_each_persistent_spawn_worker_runs_its_own_loop_thread_and_restarts_after_break(ids_1003):
    """Two persistent spawn workers: epoch 0 whole, epoch 1 broken off after 3 batches, then
    epoch 2 whole: every batch exact; each worker reads in its own process with one loop thread of
    its own, the main process runs none; a new iteration after ``break`` starts clean."""
    loader = PrefetchLoader(ids_1003, 10, columns=["id"], transform=record_process)
    data = DataLoader(
        loader,
        batch_size=None,
        num_workers=2,
        multiprocessing_context="spawn",  # as the README says (most tests fork from WORKERS)
        persistent_workers=True,
        timeout=60,
    )
    batches, main_loops = read(data)
    assert batch_ids(batches) == expected_rank_ids(loader, epoch=0)
    pids = check_one_loop_per_worker(batches, 2)
    assert set(main_loops) == {0}

    batches, main_loops = read(data, stop_after=3)
    assert batch_ids(batches) == expected_rank_ids(loader, epoch=1)[:3]
    assert check_one_loop_per_worker(batches, 2) == pids  # the same (persistent) workers
    assert set(main_loops) == {0}

    batches, main_loops = read(data)
    assert batch_ids(batches) == expected_rank_ids(loader, epoch=2)
    # (the broken iteration's loop thread may still be closing beside the new one: not counted)
    assert [pid for pid, _ in owners(batches)[:2]] == pids
    assert set(main_loops) == {0} and not loop_threads()


@pytest.mark.slow
@stops_workers_mid_epoch
@pytest.mark.parametrize("make_loader", ["memory"], indirect=True)  # see READ_MODES
def test_spawn_workers_after_break_read_the_next_epoch_exactly(make_loader, ids_1003):
    """Non-persistent spawn workers: ``break`` after 3 batches, then iterate the DataLoader again:
    new worker processes, each with its own loop thread, read exactly the next epoch."""
    loader = make_loader(ids_1003, 10, columns=["id"], transform=record_process)
    data = DataLoader(
        loader, batch_size=None, num_workers=2, multiprocessing_context=WORKERS, timeout=60
    )
    batches, main_loops = read(data, stop_after=3)
    assert batch_ids(batches) == expected_rank_ids(loader, epoch=0)[:3]
    first_pids = check_one_loop_per_worker(batches, 2)
    batches, main_loops = read(data)
    assert batch_ids(batches) == expected_rank_ids(loader, epoch=1)
    assert not set(check_one_loop_per_worker(batches, 2)) & set(first_pids)
    assert set(main_loops) == {0} and not loop_threads()
