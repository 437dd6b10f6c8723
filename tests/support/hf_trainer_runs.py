"""examples/hf_trainer.py for tests/test_recipes.py, in one launch.

    python hf_trainer_runs.py <folder>
    torchrun --nproc_per_node 2 hf_trainer_runs.py <folder> ddp

In one process: a full run (64 rows, batches of 8, 2 epochs, a checkpoint every 11 steps), a run
resumed from its ``checkpoint-11``, the same with 2 batches an optimizer step (a checkpoint every
5 steps, resumed from ``checkpoint-5``), then a stock ``Trainer`` given the loader as its train
dataset (the error it meets is printed). Under ``torchrun`` (``ddp``): a full run with batches of
4 and a checkpoint every 5 steps, and a run resumed from its ``checkpoint-5``. Each run records
its batches in ``<folder>/<name>-<rank>.jsonl``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "examples"))

import hf_trainer  # noqa: E402
from transformers import Trainer  # noqa: E402

from lance_prefetch import PrefetchLoader  # noqa: E402


def main() -> None:
    folder = Path(sys.argv[1])
    ddp = sys.argv[2:] == ["ddp"]
    uri = str(folder / "data.lance")
    runs = [
        ("full", []),
        ("resumed", ["--resume", str(folder / "full" / "checkpoint-11")]),
        ("accumulated", ["--accumulate", "2", "--save-steps", "5"]),
        (
            "accumulated-resumed",
            ["--accumulate", "2", "--resume", f"{folder}/accumulated/checkpoint-5"],
        ),
    ]
    if ddp:
        runs = [
            ("full", ["--batch-size", "4", "--save-steps", "5"]),
            ("resumed", ["--batch-size", "4", "--resume", str(folder / "full" / "checkpoint-5")]),
        ]
    for name, options in runs:
        record = str(folder / f"{name}-{{rank}}.jsonl")
        argv = ["--uri", uri, "--output", str(folder / name), "--record", record, *options]
        hf_trainer.train(hf_trainer.parse_args(argv))
    if ddp:
        return
    # the pitfall: the stock Trainer batches the loader's batches
    args = hf_trainer.parse_args(["--uri", uri, "--output", str(folder / "stock")])
    loader = PrefetchLoader(uri, 8, columns=hf_trainer.COLUMNS, seed=0)
    trainer = Trainer(
        model=hf_trainer.Classifier(),
        args=hf_trainer.TrainingArguments(
            args.output, per_device_train_batch_size=8, report_to=[], use_cpu=True
        ),
        train_dataset=loader,
    )
    try:
        trainer.train()
    except ValueError as error:
        print(f"stock Trainer: {error}")  # noqa: T201


if __name__ == "__main__":
    main()
