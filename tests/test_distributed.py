"""torchrun: a DDP job with spawn workers per rank, interrupted and resumed on more ranks.

Runs ``examples/ddp_train.py`` (the documented example) under ``torchrun`` on the CPU (gloo).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lance_prefetch import PrefetchLoader

EXAMPLE = Path(__file__).parents[1] / "examples" / "ddp_train.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]


def torchrun(nproc: int, *args: str, timeout: float = 150) -> str:
    """Run the example on ``nproc`` ranks; its stdout (fails the test on a non-zero exit)."""
    done = subprocess.run(
        [*TORCHRUN, "--nproc_per_node", str(nproc), str(EXAMPLE), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def records(directory: Path, world_size: int) -> dict[tuple[int, int], list[list[int]]]:
    """``(rank, epoch) -> [ids of each step]`` from the example's --record files."""
    steps: dict[tuple[int, int], list[list[int]]] = {}
    for rank in range(world_size):
        for line in (directory / f"ids-{rank}.jsonl").read_text().splitlines():
            record = json.loads(line)
            steps.setdefault((record["rank"], record["epoch"]), []).append(record["ids"])
    return steps


def expected(uri: str, epoch: int, rank: int, world_size: int, start: int = 0) -> list[list[int]]:
    loader = PrefetchLoader(uri, 10, columns=["id"], rank=rank, world_size=world_size)
    plan = loader.epoch_plan(epoch, start=start)
    return [batch.indices.tolist() for batch in plan.rank_batches(rank)]


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(360)  # two torchrun launches, each bounded at 150 s
def test_torchrun_job_with_spawn_workers_interrupted_mid_epoch_resumes_on_three_ranks(tmp_path):
    """2 ranks x 2 spawn workers over 1,003 rows, batch 10: epoch 0 delivers every id once over
    the ranks (but the 3-row tail), each rank the steps of its plan; stopped after 67 steps (epoch
    1, batch 17, saved from StatefulDataLoader's worker states) and resumed on 3 ranks without
    workers: epoch 1 still delivers every id once over old and new ranks."""
    uri = str(tmp_path / "train.lance")
    record = str(tmp_path / "ids-{rank}.jsonl")
    out = torchrun(2, "--uri", uri, "--num-workers", "2", "--stop-after", "67", "--record", record)
    assert "epoch 0: 50 steps per rank" in out and "saved at epoch 1, global batch 34" in out
    steps = records(tmp_path, 2)
    ids = [i for rank in range(2) for batch in steps[rank, 0] for i in batch]
    assert len(ids) == 1000 and len(set(ids)) == 1000 and set(ids) <= set(range(1003))
    for rank in range(2):
        assert steps[rank, 0] == expected(uri, 0, rank, 2)
    out = torchrun(3, "--uri", uri, "--num-workers", "0", "--resume", "--record", record)
    assert "resumed at epoch 1, global batch 34" in out and "epoch 1: 22 steps per rank" in out
    steps = records(tmp_path, 3)
    for rank in range(2):
        assert steps[rank, 1][:17] == expected(uri, 1, rank, 2)[:17]
    for rank in range(3):
        assert steps[rank, 1][-22:] == expected(uri, 1, rank, 3, start=34)
    ids = [i for rank in range(3) for batch in steps[rank, 1] for i in batch]
    assert len(ids) == 1000 and len(set(ids)) == 1000
