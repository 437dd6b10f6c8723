"""examples/pointcloud_knn.py: runs on a tiny size, and its neighbour lists are right."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
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
