"""Train with PyTorch Lightning on a Lance dataset; validate on every row; resume from checkpoints.

    python examples/lightning_train.py --uri /tmp/pl.lance --strategy ddp --devices 2
    # resume from a checkpoint it saved (end of an epoch, or mid-epoch with --every-n-steps):
    python examples/lightning_train.py --uri /tmp/pl.lance --resume /tmp/pl.lance.ckpt/end-epoch=0.ckpt

What it shows (docs/frameworks.md explains each):
- ``train_dataloader`` returns the bare ``PrefetchLoader``, built in ``setup()`` (or, with
  ``--build-in-init``, in the DataModule's ``__init__``, as ``ddp_spawn`` users often do): epoch
  ``k`` of ``trainer.fit`` reads permutation ``k`` on each rank's share.
- Lightning saves the loader's ``state_dict()`` in its checkpoints and loads it on a mid-epoch
  resume; it sets the epoch it is at through the loader's ``sampler`` as each epoch starts, which
  a run resumed from an end-of-epoch checkpoint needs (Lightning loads no loader state there):
  either way it reads the batches the uninterrupted run reads.
- ``--wrap stateful`` wraps the loader in torchdata's ``StatefulDataLoader`` (``--wrap
  dataloader``: a plain ``DataLoader``, whose state Lightning does not save): Lightning cannot
  reach a wrapped loader's epoch, so the ``LoaderEpochs`` callback sets it (``--loader-epochs
  on|off`` adds it to a bare loader's run, or leaves it out of a wrapped one's: a wrapped run
  then warns).
- Validation through ``shuffle=False``: every row once per pass across ranks, nothing padded;
  metrics are summed over ranks at the epoch's end (``sync_dist=True``), never per step (a rank
  may have one batch fewer).

Creates a synthetic dataset at ``--uri`` when none is there.
"""

from __future__ import annotations

import argparse
import json
import os

import lightning as L
import torch
from classification_data import CLASSES, COLUMNS, FEATURES, write_dataset
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader

from lance_prefetch import PrefetchLoader
from lance_prefetch.integrations.lightning import LoaderEpochs


class LanceData(L.LightningDataModule):
    """Training batches shuffled every epoch; validation batches in the dataset's order."""

    def __init__(self, uri: str, batch_size: int, *, build_in_init: bool, wrap: str):
        super().__init__()
        self.uri, self.batch_size, self.wrap = uri, batch_size, wrap
        self.train = self.val = None
        if build_in_init:  # ranks are read where the loader reads (the spawned process)
            self._build()

    def _build(self) -> None:
        self.train = PrefetchLoader(self.uri, self.batch_size, columns=COLUMNS, seed=0)
        self.val = PrefetchLoader(self.uri, self.batch_size, columns=COLUMNS, shuffle=False)

    def setup(self, stage: str) -> None:
        if self.train is None:  # the process group exists here: ranks are detected from it
            self._build()

    def train_dataloader(self):
        if self.wrap == "stateful":  # mid-epoch resume through the wrapper's state
            from torchdata.stateful_dataloader import StatefulDataLoader

            return StatefulDataLoader(self.train, batch_size=None)
        if self.wrap == "dataloader":  # no state to save: resumes at epoch boundaries only
            return DataLoader(self.train, batch_size=None)
        return self.train  # Lightning sets its epoch (through loader.sampler) and saves its state

    def val_dataloader(self):
        return self.val


class Classifier(L.LightningModule):
    """A linear classifier that records the ids of every batch it sees (``--record``)."""

    def __init__(self, record: str | None):
        super().__init__()
        self.model = nn.Linear(FEATURES, CLASSES)
        self.record_path, self.record = record, None

    def on_fit_start(self) -> None:
        if self.record_path:
            self.record = open(self.record_path.format(rank=self.global_rank), "a", buffering=1)

    def _write(self, stage: str, batch) -> None:
        if self.record:
            line = {"stage": stage, "epoch": self.current_epoch, "ids": batch["id"].tolist()}
            self.record.write(json.dumps(line) + "\n")

    def training_step(self, batch, batch_idx):
        self._write("train", batch)
        loss = nn.functional.cross_entropy(self.model(batch["features"]), batch["label"])
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self._write("val", batch)
        correct = (self.model(batch["features"]).argmax(1) == batch["label"]).sum()
        # Summed over ranks at the epoch's end: exact over the validation rows.
        self.log(
            "val_correct",
            correct.float(),
            reduce_fx="sum",
            sync_dist=True,
            on_step=False,
            on_epoch=True,
            batch_size=len(batch["id"]),
        )

    def on_fit_end(self) -> None:
        if self.record:
            self.record.close()
        if self.trainer.is_global_zero:
            correct = int(self.trainer.callback_metrics["val_correct"])
            print(
                f"done: epoch {self.current_epoch}, step {self.global_step}, val_correct {correct}",
                flush=True,
            )

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", required=True, help="Lance dataset (created if missing)")
    parser.add_argument("--rows", type=int, default=1003, help="rows of a created dataset")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--strategy", default="ddp", help="ddp, ddp_spawn, auto, ...")
    parser.add_argument("--devices", type=int, default=2, help="CPU processes")
    parser.add_argument("--build-in-init", action="store_true", help="loaders built in __init__")
    parser.add_argument(
        "--wrap",
        choices=["bare", "dataloader", "stateful"],
        default="bare",
        help="return the loader, a DataLoader or a StatefulDataLoader over it",
    )
    parser.add_argument(
        "--loader-epochs",
        choices=["auto", "on", "off"],
        default="auto",
        help="the LoaderEpochs callback (auto: for a wrapped loader)",
    )
    parser.add_argument("--checkpoints", default=None, help="default: <uri>.ckpt")
    parser.add_argument("--every-n-steps", type=int, default=None, help="also save mid-epoch")
    parser.add_argument("--resume", default=None, help="a checkpoint to resume from")
    parser.add_argument("--record", default=None, help="append each batch's ids here ({rank})")
    return parser.parse_args(argv)


def fit(args: argparse.Namespace) -> None:
    """One ``trainer.fit`` as the arguments say (see ``--help``)."""
    if not os.path.exists(args.uri) and os.environ.get("LOCAL_RANK", "0") == "0":
        write_dataset(args.uri, args.rows)

    L.seed_everything(0, verbose=False)
    folder = args.checkpoints or args.uri.rstrip("/") + ".ckpt"
    # at the end of every epoch (end-<epoch>.ckpt), and every --every-n-steps steps
    callbacks = [
        ModelCheckpoint(
            dirpath=folder, filename="end-{epoch}", save_top_k=-1, save_on_train_epoch_end=True
        ),
    ]
    if args.loader_epochs == "on" or (args.loader_epochs == "auto" and args.wrap != "bare"):
        callbacks.append(LoaderEpochs())  # sets a wrapped loader's epoch (Lightning cannot)
    if args.every_n_steps:
        callbacks.append(
            ModelCheckpoint(
                dirpath=folder,
                filename="step-{step}",
                save_top_k=-1,
                every_n_train_steps=args.every_n_steps,
            )
        )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=args.strategy,
        max_epochs=args.epochs,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    data = LanceData(args.uri, args.batch_size, build_in_init=args.build_in_init, wrap=args.wrap)
    trainer.fit(Classifier(args.record), datamodule=data, ckpt_path=args.resume)


if __name__ == "__main__":
    fit(parse_args())
