"""examples/pointcloud_knn.py: runs on a tiny size, and its neighbour lists are right;
examples/tensorboard_stats.py: the event file TensorBoard reads back holds the loader's scalars at
the steps and epochs the example writes them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader

from lance_prefetch import LanceMapDataset, collate

EXAMPLES = Path(__file__).parents[1] / "examples"


@pytest.fixture(scope="module")
def pointcloud_knn(tmp_path_factory):
    """The example as a module (importable by spawned workers too: sys.path travels with spawn)."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        import pointcloud_knn

        yield pointcloud_knn
    finally:
        sys.path.remove(str(EXAMPLES))


@pytest.mark.system
@pytest.mark.slow
def test_neighbour_lists_equal_brute_force(pointcloud_knn, tmp_path):
    """KNearest, run in a spawn worker on batches from LanceMapDataset, equals a brute-force
    search (all pairwise distances, sorted) on the same clouds."""
    uri = str(tmp_path / "clouds.lance")
    pointcloud_knn.write_pointclouds(uri, clouds=24, points=40, seed=1)
    dataset = LanceMapDataset(uri, transform=pointcloud_knn.KNearest(5))
    data = DataLoader(
        dataset, batch_size=8, num_workers=1, multiprocessing_context="spawn", collate_fn=collate
    )
    batches = list(data)
    assert [b["points"].shape for b in batches] == [(8, 40, 3)] * 3
    for batch in batches:
        points = batch["points"].double()
        distances = torch.cdist(points, points)
        distances.diagonal(dim1=1, dim2=2).fill_(float("inf"))  # not its own neighbour
        brute = distances.argsort(dim=2, stable=True)[:, :, :5]
        assert batch["neighbors"].shape == (8, 40, 5)
        assert torch.equal(batch["neighbors"], brute)


@pytest.mark.system
@pytest.mark.slow
def test_example_runs_on_a_tiny_size(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "pointcloud_knn.py"),
            "--uri",
            str(tmp_path / "pc.lance"),
            "--clouds",
            "48",
            "--points",
            "24",
            "--k",
            "4",
            "--batch-size",
            "8",
            "--epochs",
            "1",
            "--workers",
            "0,1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["num_workers=0", "num_workers=1"]
    assert all("clouds/s, accuracy" in line for line in lines)


@pytest.fixture
def tensorboard_stats():
    sys.path.insert(0, str(EXAMPLES))
    try:
        import tensorboard_stats

        yield tensorboard_stats
    finally:
        sys.path.remove(str(EXAMPLES))


def test_the_event_file_holds_the_loaders_scalars(tensorboard_stats, tmp_path):
    """203 rows, 10-row batches (20 full ones an epoch), 2 epochs, stats every 5 steps: 8 step
    points (5 ... 40) of each step key, 2 epoch points (0, 1) of each epoch key."""
    logdir = tmp_path / "runs"
    argv = ["--uri", str(tmp_path / "data.lance"), "--logdir", str(logdir), "--rows", "203"]
    argv += ["--batch-size", "10", "--every-n-steps", "5"]
    tensorboard_stats.train(tensorboard_stats.parse_args(argv))
    events = EventAccumulator(str(logdir))
    events.Reload()
    step_tags = [f"loader/{key}" for key in tensorboard_stats.STEP_KEYS]
    epoch_tags = [f"loader_epoch/{key}" for key in tensorboard_stats.EPOCH_KEYS]
    assert sorted(events.Tags()["scalars"]) == sorted(["train/loss", *step_tags, *epoch_tags])
    for tag in ["train/loss", *step_tags]:
        assert [e.step for e in events.Scalars(tag)] == list(range(5, 41, 5)), tag
    for tag in epoch_tags:
        assert [e.step for e in events.Scalars(tag)] == [0, 1], tag
    assert [e.value for e in events.Scalars("loader_epoch/batches")] == [20, 20]
    for tag in ("loader/wait_fraction", "loader_epoch/wait_fraction_total"):
        assert all(0 <= e.value <= 1 for e in events.Scalars(tag)), tag
    for tag in ("loader/rows_per_s", "loader/take_ms_p50", "loader_epoch/rows_per_s_total"):
        assert all(e.value > 0 for e in events.Scalars(tag)), tag
