"""examples/hf_trainer.py for tests/test_recipes.py, in one process: a full run (2 epochs, a
checkpoint every 11 steps), a run resumed from its ``checkpoint-11``, the same with 2 batches an
optimizer step (a checkpoint every 5 steps, resumed from ``checkpoint-5``), then a stock ``Trainer``
given the loader as its train dataset (the error it meets is printed).

    python hf_trainer_runs.py <folder>
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
    uri = str(folder / "data.lance")
    for name, options in (
        ("full", []),
        ("resumed", ["--resume", str(folder / "full" / "checkpoint-11")]),
        ("accumulated", ["--accumulate", "2", "--save-steps", "5"]),
        (
            "accumulated-resumed",
            ["--accumulate", "2", "--resume", str(folder / "accumulated" / "checkpoint-5")],
        ),
    ):
        argv = ["--uri", uri, "--output", str(folder / name), "--record"]
        hf_trainer.train(hf_trainer.parse_args([*argv, str(folder / f"{name}.jsonl"), *options]))
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
