"""Train with Hugging Face's ``Trainer`` on a Lance dataset: the loader's batches as they are.

    python examples/hf_trainer.py --uri /tmp/hf.lance --output /tmp/hf-out
    # resume from a checkpoint the Trainer saved (every --save-steps steps):
    python examples/hf_trainer.py --uri /tmp/hf.lance --output /tmp/hf-out --resume /tmp/hf-out/checkpoint-11

What it shows (docs/recipes.md explains each):
- ``Trainer.get_train_dataloader`` wraps a train dataset in ``DataLoader(dataset,
  batch_size=per_device_train_batch_size)``: over the loader, which yields whole batches, that
  would collate batches of batches (the loader refuses it with a ``ValueError``).
  ``LanceTrainer`` overrides it to prepare ``DataLoader(loader, batch_size=None)`` with the
  Trainer's accelerator, as Accelerate's own recipe does (docs/frameworks.md).
- The Trainer calls ``set_epoch(epoch)`` on that DataLoader as each epoch starts, and Accelerate
  passes it on to the loader: epoch ``k`` reads permutation ``k``.
- A run resumed from a Trainer checkpoint skips the batches of the resumed epoch that were
  trained (Accelerate's ``skip_first_batches``: it reads them again and drops them), so it trains
  on the batches the uninterrupted run trained on.

Creates a synthetic dataset at ``--uri`` when none is there.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from classification_data import CLASSES, COLUMNS, FEATURES, write_dataset
from torch import nn
from torch.utils.data import DataLoader
from transformers import Trainer, TrainingArguments

from lance_prefetch import PrefetchLoader


class LanceTrainer(Trainer):
    """A ``Trainer`` whose ``train_dataset`` is a ``PrefetchLoader`` (it makes the batches)."""

    def get_train_dataloader(self) -> DataLoader:
        workers = self.args.dataloader_num_workers
        data = DataLoader(
            self.train_dataset,
            batch_size=None,  # the loader makes the batches: no re-batching
            num_workers=workers,
            multiprocessing_context="spawn" if workers else None,
            persistent_workers=workers > 0 and self.args.dataloader_persistent_workers,
            pin_memory=self.args.dataloader_pin_memory and torch.cuda.is_available(),
        )
        return self.accelerator.prepare(data)  # set_epoch reaches the loader through it


class Classifier(nn.Module):
    """A linear classifier; the Trainer calls it with the batch's columns as keywords and reads
    ``loss`` from the dict it returns. ``seen`` records each training batch's ``id``s."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(FEATURES, CLASSES)
        self.seen: list[list[int]] = []

    def forward(self, features: torch.Tensor, label: torch.Tensor, id: torch.Tensor) -> dict:
        if self.training:
            self.seen.append(id.tolist())
        logits = self.linear(features)
        return {"loss": nn.functional.cross_entropy(logits, label), "logits": logits}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", required=True, help="Lance dataset (created if missing)")
    parser.add_argument("--rows", type=int, default=64, help="rows of a created dataset")
    parser.add_argument("--output", required=True, help="the Trainer's output_dir")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--accumulate", type=int, default=1, help="batches per optimizer step")
    parser.add_argument("--save-steps", type=int, default=11, help="optimizer steps")
    parser.add_argument("--resume", default=None, help="a checkpoint folder the Trainer saved")
    parser.add_argument("--record", default=None, help="write each batch's ids here ({rank})")
    return parser.parse_args(argv)


def train(args: argparse.Namespace) -> Classifier:
    """Train as the arguments say (see ``--help``); the trained model."""
    torch.manual_seed(0)
    model = Classifier()
    training = TrainingArguments(
        args.output,
        per_device_train_batch_size=args.batch_size,  # for the Trainer's counts and logs only
        num_train_epochs=args.epochs,
        gradient_accumulation_steps=args.accumulate,
        learning_rate=0.1,
        save_strategy="steps",
        save_steps=args.save_steps,
        logging_strategy="no",
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        disable_tqdm=True,
    )
    with training.main_process_first(desc="the dataset"):  # processes from torchrun
        if not os.path.exists(args.uri):
            write_dataset(args.uri, args.rows)
    # built after TrainingArguments: ranks come from the process group it set up
    loader = PrefetchLoader(args.uri, args.batch_size, columns=COLUMNS, seed=0)
    trainer = LanceTrainer(model=model, args=training, train_dataset=loader)
    trainer.train(resume_from_checkpoint=args.resume)
    if args.record:
        with open(args.record.format(rank=training.process_index), "w") as out:
            for ids in model.seen:
                out.write(json.dumps({"ids": ids}) + "\n")
    print(f"trained {trainer.state.global_step} steps, {len(model.seen)} batches in this run")
    return model


if __name__ == "__main__":
    train(parse_args())
