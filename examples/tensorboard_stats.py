"""Train a small classifier and watch the loader in TensorBoard: ``loader.stats()`` as scalars.

    python examples/tensorboard_stats.py --uri /tmp/tb.lance --logdir /tmp/tb-runs
    tensorboard --logdir /tmp/tb-runs

What it shows (docs/stats.md explains each figure):
- Every ``--every-n-steps`` steps, ``loader.stats().to_dict()`` (plain numbers) goes to
  ``SummaryWriter.add_scalar`` as ``loader/<key>``, at the global step: the last 10 s's wait
  fraction (near 1: the step waits for data; near 0: the step is the bottleneck), rows/s, MiB/s,
  the take latency p50 in ms and the batches ready in the queue.
- At each epoch's end the whole epoch's figures, as ``loader_epoch/<key>`` at the epoch number.

Needs ``pip install tensorboard``. Creates a synthetic dataset at ``--uri`` when none is there.
"""

from __future__ import annotations

import argparse
import os

import torch
from classification_data import CLASSES, FEATURES, write_dataset
from torch import nn
from torch.utils.tensorboard import SummaryWriter

from lance_prefetch import PrefetchLoader

#: The ``LoaderStats`` keys written every few steps (the recent window's figures) ...
STEP_KEYS = ("wait_fraction", "rows_per_s", "mib_per_s", "take_ms_p50", "queue_depth")
#: ... and at each epoch's end (the whole epoch's).
EPOCH_KEYS = ("wait_fraction_total", "rows_per_s_total", "mib_per_s_total", "batches")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", required=True, help="Lance dataset (created if missing)")
    parser.add_argument("--logdir", required=True, help="TensorBoard's log folder")
    parser.add_argument("--rows", type=int, default=10_000, help="rows of a created dataset")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--every-n-steps", type=int, default=10, help="steps between stats")
    return parser.parse_args(argv)


def write_stats(writer: SummaryWriter, prefix: str, stats: dict, keys: tuple, step: int) -> None:
    """``stats[key]`` as the scalar ``<prefix>/<key>`` at ``step``, for each key with a value
    (``take_ms_p50`` is ``None`` before the first take returned)."""
    for key in keys:
        if stats[key] is not None:
            writer.add_scalar(f"{prefix}/{key}", stats[key], step)


def train(args: argparse.Namespace) -> None:
    """Train as the arguments say (see ``--help``), writing the loader's stats to ``--logdir``."""
    if not os.path.exists(args.uri):
        write_dataset(args.uri, args.rows)
    torch.manual_seed(0)
    model = nn.Linear(FEATURES, CLASSES)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = PrefetchLoader(args.uri, args.batch_size, columns=["features", "label"])
    step = 0
    with SummaryWriter(args.logdir) as writer:
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            for batch in loader:
                loss = nn.functional.cross_entropy(model(batch["features"]), batch["label"])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                step += 1
                if step % args.every_n_steps == 0:
                    writer.add_scalar("train/loss", loss.item(), step)
                    write_stats(writer, "loader", loader.stats().to_dict(), STEP_KEYS, step)
            write_stats(writer, "loader_epoch", loader.stats().to_dict(), EPOCH_KEYS, epoch)


if __name__ == "__main__":
    train(parse_args())
