"""Train a small model with DDP on a Lance dataset, checkpoint mid-epoch, and resume exactly.

    torchrun --nproc_per_node 2 examples/ddp_train.py --uri /tmp/ddp-demo.lance --epochs 2
    # interrupted after 67 steps, then resumed (possibly with another --nproc_per_node):
    torchrun --nproc_per_node 2 examples/ddp_train.py --uri /tmp/ddp-demo.lance --stop-after 67
    torchrun --nproc_per_node 3 examples/ddp_train.py --uri /tmp/ddp-demo.lance --resume

What it shows (docs/distributed.md explains each):
- ``PrefetchLoader`` takes ``rank``/``world_size`` from torchrun's environment at construction and
  hands them to its spawn DataLoader workers; every rank runs the same number of steps.
- ``set_epoch`` reaches persistent workers.
- torchdata's ``StatefulDataLoader`` records, per worker, which batches reached the training loop;
  ``state_from_dataloader`` merges that into one small dict saved with the model. On resume it is
  loaded into the ``PrefetchLoader`` (not the DataLoader), so ``num_workers`` and the number of
  ranks may change.

Needs ``pip install torchdata``. Creates a synthetic dataset at ``--uri`` when none is there.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from classification_data import CLASSES, FEATURES, write_dataset
from torch import nn
from torchdata.stateful_dataloader import StatefulDataLoader

from lance_prefetch import PrefetchLoader, state_from_dataloader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", required=True, help="Lance dataset (created if missing)")
    parser.add_argument("--rows", type=int, default=1003, help="rows of a created dataset")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--checkpoint", default=None, help="default: <uri>.ckpt")
    parser.add_argument("--stop-after", type=int, default=None, help="save and exit after N steps")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    parser.add_argument(
        "--record", default=None, help="append each step's ids to this file ({rank} is replaced)"
    )
    args = parser.parse_args()
    checkpoint = Path(args.checkpoint or args.uri.rstrip("/") + ".ckpt")

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 0 and not os.path.exists(args.uri):
        write_dataset(args.uri, args.rows)
    dist.barrier()

    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(FEATURES, CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # rank and world_size: from the initialized process group (torchrun's RANK/WORLD_SIZE)
    loader = PrefetchLoader(args.uri, args.batch_size, columns=["id", "features", "label"], seed=0)
    first_epoch, step = 0, 0
    if args.resume:
        saved = torch.load(checkpoint, weights_only=False)
        model.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["data"])  # before the DataLoader starts its workers
        first_epoch, step = saved["data"]["epoch"], saved["step"]
        if rank == 0:
            print(f"resumed at epoch {first_epoch}, global batch {saved['data']['position']}")
    dataloader = StatefulDataLoader(
        loader,
        batch_size=None,  # the loader makes the batches
        num_workers=args.num_workers,
        multiprocessing_context="spawn" if args.num_workers else None,
        persistent_workers=args.num_workers > 0,
    )
    record = open(args.record.format(rank=rank), "a", buffering=1) if args.record else None
    for epoch in range(first_epoch, args.epochs):
        loader.set_epoch(epoch)  # keeps a resumed position in its epoch
        steps, total_loss = 0, torch.zeros(())
        for batch in dataloader:
            loss = nn.functional.cross_entropy(model(batch["features"]), batch["label"])
            optimizer.zero_grad()
            loss.backward()  # DDP all-reduces: every rank must run the same number of steps
            optimizer.step()
            steps, step, total_loss = steps + 1, step + 1, total_loss + loss.detach()
            if record:
                ids = batch["id"].tolist()
                record.write(json.dumps({"rank": rank, "epoch": epoch, "ids": ids}) + "\n")
            if step == args.stop_after:
                data = state_from_dataloader(dataloader.state_dict())
                if rank == 0:  # every rank holds the same state
                    torch.save(
                        {
                            "model": model.module.state_dict(),
                            "optimizer": optimizer.state_dict(),
                            "data": data,
                            "step": step,
                        },
                        checkpoint,
                    )
                    print(f"saved at epoch {epoch}, global batch {data['position']}: {checkpoint}")
                dist.barrier()
                dist.destroy_process_group()
                return
        if rank == 0:  # rank 0's own batches: see docs/distributed.md, "Leaving cleanly"
            mean = total_loss.item() / max(steps, 1)
            print(f"epoch {epoch}: {steps} steps per rank, rank 0 mean loss {mean:.3f}")
    if record:
        record.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
