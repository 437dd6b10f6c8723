"""Point clouds with k-nearest-neighbour preprocessing in DataLoader workers.

    python examples/pointcloud_knn.py --clouds 2000 --points 256 --k 16 --workers 0,2,4

Writes a small point-cloud dataset, then trains a tiny model for each ``num_workers`` in
``--workers`` and prints the throughput. The neighbour lists are computed in ``transform``, batch by
batch, inside the DataLoader's worker processes, so that CPU work runs in parallel with training and
with each other.

Dataset (``--uri``, created if missing):
    ``points``: fixed_size_list<fixed_size_list<float32>[3]>[P], one cloud of P points (x, y, z)
        per row; a batch gives a float32 tensor of shape ``(batch, P, 3)``.
    ``label``: int64 in ``[0, 3)``: the shape the points were drawn from (sphere, cube, plane).

``transform`` (:class:`KNearest`) adds ``neighbors``: int64, shape ``(batch, P, k)``, the indices of
each point's k nearest other points in its cloud (by Euclidean distance, nearest first), from a
k-d tree (``scipy.spatial.cKDTree``).
"""

from __future__ import annotations

import argparse
import os
import time

import lance
import numpy as np
import pyarrow as pa
import torch
from scipy.spatial import cKDTree
from torch import nn
from torch.utils.data import DataLoader

from lance_prefetch import LanceMapDataset, collate

SHAPES = ("sphere", "cube", "plane")


def write_pointclouds(uri: str, clouds: int, points: int, seed: int = 0) -> None:
    """``clouds`` rows of ``points`` points each, drawn from one of :data:`SHAPES` plus noise."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(SHAPES), clouds)
    xyz = rng.normal(size=(clouds, points, 3)).astype(np.float32)
    sphere = labels == 0
    xyz[sphere] /= np.linalg.norm(xyz[sphere], axis=2, keepdims=True)
    cube = labels == 1
    xyz[cube] = rng.uniform(-1, 1, size=(int(cube.sum()), points, 3))
    xyz[labels == 2, :, 2] = 0.0  # a plane
    xyz += 0.02 * rng.normal(size=xyz.shape).astype(np.float32)
    flat = pa.array(xyz.reshape(-1))
    column = pa.FixedSizeListArray.from_arrays(pa.FixedSizeListArray.from_arrays(flat, 3), points)
    table = pa.table({"points": column, "label": pa.array(labels)})
    lance.write_dataset(table, uri, mode="overwrite", max_rows_per_file=max(clouds // 4, 1))


class KNearest:
    """``transform``: add each point's ``k`` nearest neighbours in its cloud (see module docstring).

    Args:
        k (int): neighbours per point, ``1 <= k < P``.
    """

    def __init__(self, k: int) -> None:
        self.k = k

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        clouds = batch["points"].numpy()
        neighbors = np.empty(clouds.shape[:2] + (self.k,), dtype=np.int64)
        for i, cloud in enumerate(clouds):
            _, nearest = cKDTree(cloud).query(cloud, k=self.k + 1)  # the first is the point itself
            neighbors[i] = nearest[:, 1:]
        return {**batch, "neighbors": torch.from_numpy(neighbors)}


class EdgeNet(nn.Module):
    """Per point: its position and the mean offset to its neighbours; max-pooled per cloud."""

    def __init__(self, classes: int = len(SHAPES), width: int = 32) -> None:
        super().__init__()
        self.point = nn.Sequential(nn.Linear(6, width), nn.ReLU(), nn.Linear(width, width))
        self.head = nn.Linear(width, classes)

    def forward(self, points: torch.Tensor, neighbors: torch.Tensor) -> torch.Tensor:
        batch, count, k = neighbors.shape
        gathered = torch.gather(
            points.unsqueeze(1).expand(batch, count, count, 3),
            2,
            neighbors.unsqueeze(-1).expand(batch, count, k, 3),
        )  # (batch, P, k, 3)
        offsets = (gathered - points.unsqueeze(2)).mean(dim=2)
        features = self.point(torch.cat([points, offsets], dim=-1))
        return self.head(features.max(dim=1).values)


def train(
    uri: str, *, k: int, batch_size: int, epochs: int, num_workers: int
) -> tuple[float, float]:
    """Train for ``epochs``; ``(clouds per second, accuracy on the last epoch's batches)``."""
    torch.manual_seed(0)
    dataset = LanceMapDataset(uri, transform=KNearest(k))
    data = DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        num_workers=num_workers,
        multiprocessing_context="spawn" if num_workers else None,
        persistent_workers=num_workers > 0,
        collate_fn=collate,
    )
    model = EdgeNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    iterator = iter(data)  # start the workers before the clock
    seen, correct, started = 0, 0, None
    for epoch in range(epochs):
        for batch in iterator:
            if started is None:
                started = time.perf_counter()  # after the first batch: workers are up
            logits = model(batch["points"], batch["neighbors"])
            loss = nn.functional.cross_entropy(logits, batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if epoch == epochs - 1:
                correct += int((logits.argmax(1) == batch["label"]).sum())
                seen += len(batch["label"])
        iterator = iter(data)
    elapsed = time.perf_counter() - (started or time.perf_counter())
    rate = (epochs * len(dataset) - batch_size) / max(elapsed, 1e-9)
    return rate, correct / max(seen, 1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--uri", default="pointclouds.lance")
    parser.add_argument("--clouds", type=int, default=2000)
    parser.add_argument("--points", type=int, default=256)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", default="0,2,4", help="comma-separated num_workers to try")
    args = parser.parse_args()
    if os.path.exists(args.uri):
        print(f"using the existing dataset at {args.uri} (delete it to write a new one)")
    else:
        write_pointclouds(args.uri, args.clouds, args.points)
    for num_workers in [int(w) for w in args.workers.split(",")]:
        rate, accuracy = train(
            args.uri,
            k=args.k,
            batch_size=args.batch_size,
            epochs=args.epochs,
            num_workers=num_workers,
        )
        print(
            f"num_workers={num_workers}: {rate:,.0f} clouds/s, "
            f"accuracy {accuracy:.2f} on the last epoch"
        )


if __name__ == "__main__":
    main()
