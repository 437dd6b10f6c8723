"""The training frameworks, for real: Lightning (``ddp``, ``ddp_spawn``), Accelerate and Ray Train,
each in 2 CPU processes (gloo), running the documented examples and checking every batch's ids
against the loader's own plan.

The frameworks are installed by ``make test`` (the ``frameworks`` extra): a missing one fails
here at import, never skips.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import accelerate  # noqa: F401  (installed: a missing framework fails the module)
import lightning  # noqa: F401
import pytest
import ray  # noqa: F401

from lance_prefetch import PrefetchLoader

EXAMPLES = Path(__file__).parents[1] / "examples"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
ROWS, BATCH = 403, 10  # 20 batches per rank and epoch on 2 ranks (the 3-row tail dropped)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def run(command: list[str], timeout: float = 150) -> str:
    """Run ``command`` in its own session; its stdout. Fails the test on a non-zero exit, and on a
    timeout kills everything it started (Ray's cluster included) first."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env, start_new_session=True)  # fmt: skip
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"{command[1:3]} ran past {timeout} s:\n{out}\n{err[-3000:]}")
    assert process.returncode == 0, out + err[-5000:]
    return out


def records(pattern: str) -> dict[tuple[str, int, int], list[list[int]]]:
    """``(stage, rank, epoch) -> [ids of each batch]`` from the examples' --record files."""
    steps: dict[tuple[str, int, int], list[list[int]]] = {}
    for rank in range(2):
        for line in Path(pattern.format(rank=rank)).read_text().splitlines():
            record = json.loads(line)
            key = (record.get("stage", "train"), rank, record["epoch"])
            steps.setdefault(key, []).append(record["ids"])
    return steps


def plan(uri: str, epoch: int, rank: int) -> list[list[int]]:
    """The batches rank ``rank`` of 2 reads in ``epoch`` (seed 0)."""
    loader = PrefetchLoader(uri, BATCH, columns=["id"], rank=rank, world_size=2, seed=0)
    return [batch.indices.tolist() for batch in loader.epoch_plan(epoch).rank_batches(rank)]


def check_epochs(uri: str, steps: dict, epochs: range) -> None:
    """Training epoch ``k`` read permutation ``k`` on each rank: 400 distinct ids over the ranks."""
    for epoch in epochs:
        for rank in range(2):
            assert steps["train", rank, epoch] == plan(uri, epoch, rank), (rank, epoch)
        ids = [i for rank in range(2) for batch in steps["train", rank, epoch] for i in batch]
        assert len(ids) == len(set(ids)) == 400


def check_validation(steps: dict, epochs: range) -> None:
    """Each validation pass (shuffle=False): every row once over the ranks, in dataset order."""
    for epoch in epochs:
        ids = [i for rank in range(2) for batch in steps["val", rank, epoch] for i in batch]
        assert sorted(ids) == list(range(ROWS))
        for rank in range(2):
            flat = [i for batch in steps["val", rank, epoch] for i in batch]
            assert flat == sorted(flat)


def fit(tmp_path: Path, name: str, *args: str) -> str:
    script = [sys.executable, str(EXAMPLES / "lightning_train.py")]
    return run([*script, "--uri", str(tmp_path / "data.lance"), "--rows", str(ROWS),
                "--checkpoints", str(tmp_path / "ckpt"),
                "--record", str(tmp_path / f"{name}-{{rank}}.jsonl"), *args])  # fmt: skip


def test_lightning_ddp_fit_validate_and_resume_from_both_kinds_of_checkpoint(tmp_path):
    """``ddp``, bare loader from ``setup()``: epoch k reads permutation k (Lightning's probe
    ``iter()`` uses none up), validation covers every row once; runs resumed from the
    end-of-epoch-0 checkpoint and from the mid-epoch one (step 27: epoch 1, batch 7) read what
    the uninterrupted run read."""
    uri = str(tmp_path / "data.lance")
    out = fit(tmp_path, "full", "--strategy", "ddp", "--every-n-steps", "27")
    assert "done: epoch 2, step 40, val_correct" in out
    full = records(str(tmp_path / "full-{rank}.jsonl"))
    check_epochs(uri, full, range(2))
    check_validation(full, range(2))
    fit(tmp_path, "end", "--resume", str(tmp_path / "ckpt" / "end-epoch=0.ckpt"))
    end = records(str(tmp_path / "end-{rank}.jsonl"))
    assert {key for key in end if key[0] == "train"} == {("train", 0, 1), ("train", 1, 1)}
    check_epochs(uri, end, range(1, 2))
    fit(tmp_path, "mid", "--resume", str(tmp_path / "ckpt" / "step-step=27.ckpt"))
    mid = records(str(tmp_path / "mid-{rank}.jsonl"))
    for rank in range(2):
        assert mid["train", rank, 1] == full["train", rank, 1][7:]
    check_validation(mid, range(1, 2))


def test_lightning_ddp_spawn_with_a_stateful_dataloader_built_in_init(tmp_path):
    """``ddp_spawn``, loaders built in the DataModule's ``__init__`` (before any process group),
    wrapped in ``StatefulDataLoader``: each spawned rank reads its own share; resumed from the
    mid-epoch checkpoint (step 27) epoch 1 goes on batch for batch, and from the end-of-epoch-0
    one it reads epoch 1's permutation (``LoaderEpochs``)."""
    uri = str(tmp_path / "data.lance")
    common = ["--strategy", "ddp_spawn", "--build-in-init", "--stateful"]
    out = fit(tmp_path, "full", *common, "--every-n-steps", "27")
    assert "done: epoch 2, step 40" in out
    full = records(str(tmp_path / "full-{rank}.jsonl"))
    check_epochs(uri, full, range(2))
    check_validation(full, range(2))
    fit(tmp_path, "mid", *common, "--resume", str(tmp_path / "ckpt" / "step-step=27.ckpt"))
    mid = records(str(tmp_path / "mid-{rank}.jsonl"))
    for rank in range(2):
        assert mid["train", rank, 1] == plan(uri, 1, rank)[7:]
    fit(tmp_path, "end", *common, "--resume", str(tmp_path / "ckpt" / "end-epoch=0.ckpt"))
    check_epochs(uri, records(str(tmp_path / "end-{rank}.jsonl")), range(1, 2))


@pytest.mark.parametrize("options", [["--num-workers", "2"], ["--no-dispatch"]],
                         ids=["dispatched-with-workers", "dispatch_batches=False"])  # fmt: skip
def test_accelerate_prepare_gives_every_row_once(tmp_path, options):
    """``accelerator.prepare(DataLoader(loader, batch_size=None))`` over 2 processes, with
    Accelerate's default dispatcher (and 2 spawn workers) and with ``dispatch_batches=False``:
    each process gets the batches its rank would read, 400 distinct ids an epoch, 2 epochs."""
    uri = str(tmp_path / "data.lance")
    out = run([*TORCHRUN, str(EXAMPLES / "accelerate_train.py"), "--uri", uri, "--rows", str(ROWS),
               "--record", str(tmp_path / "ids-{rank}.jsonl"), *options])  # fmt: skip
    assert "epoch 0: 20 steps per process, len 20" in out and "epoch 1: 20 steps" in out
    check_epochs(uri, records(str(tmp_path / "ids-{rank}.jsonl")), range(2))


def test_ray_train_two_workers_driver_and_loop_built_resume_exactly(tmp_path):
    """TorchTrainer, 2 workers, one local Ray cluster: a first run with the loader built in the
    driver stops after 27 steps (epoch 1, batch 7) with a checkpoint reported at that step; the
    run restored from it, with the loader built in the train loop, finishes epoch 1 exactly."""
    uri = str(tmp_path / "data.lance")
    out = run([sys.executable, str(EXAMPLES / "ray_train.py"), "--uri", uri, "--rows", str(ROWS),
               "--storage", str(tmp_path / "runs"), "--build", "both", "--stop-after", "27",
               "--checkpoint-every", "10", "--record", str(tmp_path / "ids-{rank}.jsonl")],
              timeout=240)  # fmt: skip
    assert "run ended at step 27" in out and "run ended at step 40" in out
    check_epochs(uri, records(str(tmp_path / "ids-{rank}.jsonl")), range(2))
