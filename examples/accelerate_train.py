"""Train with Hugging Face Accelerate on a Lance dataset: every row once per epoch across processes.

    torchrun --nproc_per_node 2 examples/accelerate_train.py --uri /tmp/acc.lance
    # on GPUs: accelerate launch --num_processes 2 examples/accelerate_train.py --uri ...

What it shows (docs/frameworks.md explains each):
- The form Accelerate's docs use, ``accelerator.prepare(DataLoader(loader, batch_size=None))``,
  with Accelerate's default configuration: its dispatcher reads on the main process and deals
  batches out; the loader then reads every rank's batches there, so each process gets its own
  share. ``--no-dispatch`` (``DataLoaderConfiguration(dispatch_batches=False)``) has each process
  read its own rank's share instead.
- Accelerate places each batch on ``accelerator.device``; gradient accumulation with
  ``accelerator.accumulate(model)``, an optimizer step every ``--accumulate`` batches.

Creates a synthetic dataset at ``--uri`` when none is there.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration
from classification_data import CLASSES, FEATURES, write_dataset
from torch import nn
from torch.utils.data import DataLoader

from lance_prefetch import PrefetchLoader


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", required=True, help="Lance dataset (created if missing)")
    parser.add_argument("--rows", type=int, default=1003, help="rows of a created dataset")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--accumulate", type=int, default=2, help="batches per optimizer step")
    parser.add_argument("--no-dispatch", action="store_true", help="dispatch_batches=False")
    parser.add_argument("--record", default=None, help="write each step's ids here ({rank})")
    return parser.parse_args(argv)


def train(args: argparse.Namespace) -> None:
    """Train as the arguments say (see ``--help``)."""

    config = DataLoaderConfiguration(dispatch_batches=False) if args.no_dispatch else None
    accelerator = Accelerator(
        cpu=not torch.cuda.is_available(),  # on CPUs: one process per rank, over gloo
        gradient_accumulation_steps=args.accumulate,
        dataloader_config=config,
    )
    if accelerator.is_main_process and not os.path.exists(args.uri):
        write_dataset(args.uri, args.rows)
    accelerator.wait_for_everyone()

    torch.manual_seed(0)
    model = nn.Linear(FEATURES, CLASSES)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # Built after Accelerator(): ranks come from the process group it set up.
    loader = PrefetchLoader(args.uri, args.batch_size, columns=["id", "features", "label"], seed=0)
    data = DataLoader(
        loader,
        batch_size=None,  # the loader makes the batches
        num_workers=args.num_workers,
        multiprocessing_context="spawn" if args.num_workers else None,
        persistent_workers=args.num_workers > 0,
    )
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    record = open(args.record.format(rank=accelerator.process_index), "w") if args.record else None
    for epoch in range(args.epochs):
        data.set_epoch(epoch)  # Accelerate passes it on to the loader
        steps, total_loss = 0, torch.zeros((), device=accelerator.device)
        for batch in data:
            with accelerator.accumulate(model):
                loss = nn.functional.cross_entropy(model(batch["features"]), batch["label"])
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            steps, total_loss = steps + 1, total_loss + loss.detach()
            if record:
                ids = batch["id"].tolist()
                record.write(json.dumps({"epoch": epoch, "ids": ids}) + "\n")
        if (
            accelerator.is_main_process
        ):  # its own batches: see docs/distributed.md, "Leaving cleanly"
            print(
                f"epoch {epoch}: {steps} steps per process, len {len(data)} "
                f"({type(data).__name__}), "
                f"main process mean loss {total_loss.item() / max(steps, 1):.3f}"
            )
    if record:
        record.close()


if __name__ == "__main__":
    train(parse_args())
