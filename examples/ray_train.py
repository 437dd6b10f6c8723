"""Train with Ray Train on a Lance dataset: disjoint rows per worker, checkpoint, resume exactly.

    python examples/ray_train.py --uri /tmp/ray.lance --storage /tmp/ray-runs

What it shows (docs/frameworks.md explains each):
- A ``PrefetchLoader`` built in the driver and passed in ``train_loop_config`` (or built inside
  the train loop, ``--build loop``) reads, in each Ray Train worker, the share of the rank
  that worker has: ranks are read where the loader reads, from the process group Ray sets up.
- With ``--prepare-data-loader`` the loop iterates
  ``ray.train.torch.prepare_data_loader(DataLoader(loader, batch_size=None))``: for an iterable
  dataset Ray adds no sampler, and wraps the DataLoader to move each batch to the worker's device
  one batch ahead of the step.
- Rank 0 saves ``loader.state_dict()`` with the model in the checkpoint it reports through
  ``ray.train.report(checkpoint=...)``: it counts the batches the steps consumed (with
  ``--prepare-data-loader``, not the one Ray's wrapper holds). An attempt restarted from it
  (``ray.train.get_checkpoint()``: after a failure, with ``FailureConfig(max_failures=...)``, or a
  run started again with the same name and storage path) reads the batches the uninterrupted run
  would have.

The first attempt fails after ``--stop-after`` steps (a stand-in for a lost worker); Ray Train
restarts the workers, which resume from the checkpoint reported at that step and finish.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import ray
import ray.train
import torch
from classification_data import CLASSES, COLUMNS, FEATURES, write_dataset
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer, prepare_data_loader, prepare_model
from torch import nn
from torch.utils.data import DataLoader

from lance_prefetch import PrefetchLoader


def train_loop(config: dict) -> None:
    """One Ray Train worker: resume from the run's checkpoint if there is one, train, report."""
    rank = ray.train.get_context().get_world_rank()
    checkpoint = ray.train.get_checkpoint()  # a restarted attempt: the latest one reported
    loader = config.get("loader")  # built in the driver, pickled into this worker
    if loader is None or (checkpoint and config["build"] == "both"):
        loader = PrefetchLoader(config["uri"], config["batch_size"], columns=COLUMNS, seed=0)
    torch.manual_seed(0)
    model = prepare_model(nn.Linear(FEATURES, CLASSES))  # DistributedDataParallel over gloo
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step, first_epoch = 0, 0
    if checkpoint:
        with checkpoint.as_directory() as folder:
            saved = torch.load(Path(folder) / "state.pt", weights_only=False)
        model.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["data"])
        step, first_epoch = saved["step"], saved["data"]["epoch"]
    batches = loader
    if config["prepare_data_loader"]:  # an iterable: no sampler; batches moved to the device
        batches = prepare_data_loader(DataLoader(loader, batch_size=None))
    record = open(config["record"].format(rank=rank), "a") if config.get("record") else None
    for epoch in range(first_epoch, config["epochs"]):
        loader.set_epoch(epoch)  # keeps a resumed position in its epoch
        for batch in batches:
            loss = nn.functional.cross_entropy(model(batch["features"]), batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if record:
                record.write(json.dumps({"epoch": epoch, "ids": batch["id"].tolist()}) + "\n")
                record.flush()
            if step % config["checkpoint_every"] == 0 or step == config.get("stop_after"):
                report(loader, model, optimizer, step, rank, loss.item())
            if step == config.get("stop_after") and not checkpoint:
                wait_for_reports()  # so that the restart finds this step's checkpoint
                raise RuntimeError(f"a stand-in failure at step {step}")  # Ray Train restarts
    if record:
        record.close()


def wait_for_reports(timeout: float = 60.0) -> None:
    """Wait until Ray Train's controller has taken the reports of every worker (at most
    ``timeout`` seconds). Ray Train polls each worker for one report at a time, every few
    seconds, and a failure polled before the last reports would restart the run from an older
    checkpoint: the stand-in failure waits, as a real one would come after the reports were
    taken. Reads Ray Train's worker-side report queue, whose place is internal; without it, it
    waits ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    try:
        from ray.train.v2._internal.execution.context import get_train_context

        reports = get_train_context().execution_context.result_queue
    except (ImportError, AttributeError):  # another Ray Train: wait the whole timeout
        reports = None
    while time.monotonic() < deadline and (reports is None or reports.unfinished_tasks):
        time.sleep(0.05)
    torch.distributed.barrier()  # every worker's reports taken before any fails


def report(loader, model, optimizer, step: int, rank: int, loss: float) -> None:
    """Report the metrics on every rank, with a checkpoint from rank 0 (the state is the same on
    every rank, and counts the batches the steps consumed)."""
    data = loader.state_dict()
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = None
        if rank == 0:
            state = {
                "model": model.module.state_dict(),
                "optimizer": optimizer.state_dict(),
                "data": data,
                "step": step,
            }
            torch.save(state, Path(folder) / "state.pt")
            checkpoint = Checkpoint.from_directory(folder)
        ray.train.report({"step": step, "loss": loss}, checkpoint=checkpoint)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", required=True, help="Lance dataset (created if missing)")
    parser.add_argument("--storage", required=True, help="Ray Train storage_path (a folder)")
    parser.add_argument("--rows", type=int, default=1003, help="rows of a created dataset")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--stop-after", type=int, default=67, help="fail once after N steps")
    parser.add_argument("--checkpoint-every", type=int, default=20, help="steps")
    parser.add_argument(
        "--build",
        choices=["driver", "loop", "both"],
        default="driver",
        help="where the loader is built; both: the driver, then the loop",
    )
    parser.add_argument(
        "--prepare-data-loader",
        action="store_true",
        help="iterate ray.train.torch.prepare_data_loader(DataLoader(loader, batch_size=None))",
    )
    parser.add_argument("--record", default=None, help="append each step's ids here ({rank})")
    return parser.parse_args(argv)


def fit(args: argparse.Namespace) -> ray.train.Result:
    """One TorchTrainer run (Ray initialised): 2 workers, a failure, a restart, the end."""
    if not os.path.exists(args.uri):
        write_dataset(args.uri, args.rows)
    config = {
        "uri": args.uri,
        "batch_size": args.batch_size,
        "epochs": args.epochs,
        "checkpoint_every": args.checkpoint_every,
        "record": args.record,
        "stop_after": args.stop_after,
        "build": args.build,
        "prepare_data_loader": args.prepare_data_loader,
    }
    if args.build != "loop":  # pickled to each worker; ranks are read there
        config["loader"] = PrefetchLoader(args.uri, args.batch_size, columns=COLUMNS, seed=0)
    run = RunConfig(
        name="lance-prefetch-example",
        storage_path=os.path.abspath(args.storage),
        failure_config=FailureConfig(max_failures=1),
    )
    trainer = TorchTrainer(
        train_loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=run,
    )
    result = trainer.fit()
    print(f"run ended at step {result.metrics['step']}, checkpoint {result.checkpoint.path}")
    return result


def main() -> None:
    args = parse_args()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    fit(args)
    ray.shutdown()


if __name__ == "__main__":
    main()
