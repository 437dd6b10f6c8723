"""Several ``trainer.fit`` runs of examples/lightning_train.py in one launch (Lightning starts its
``ddp`` processes once; later Trainers find them), for tests/test_frameworks.py.

    python lightning_runs.py ddp <folder>         # 4 fits: the bare loader, resumed; a warned one
    python lightning_runs.py ddp-matrix <folder>  # 14 fits: every wrapper, with and without
                                                  # LoaderEpochs, resumed
    python lightning_runs.py ddp_spawn <folder>   # 1 fit, loaders built in __init__

Each fit records its batches in ``<folder>/<name>-<rank>.jsonl``, and prints
``warned: <name> rank <rank>`` for each warning of its that names ``LoaderEpochs``.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "examples"))

import lightning_train  # noqa: E402

ROWS = 403
#: The checkpoints a resumed fit starts from: the end of epoch 0, and epoch 1's batch 7.
POINTS = {"end": "end-epoch=0.ckpt", "mid": "step-step=27.ckpt"}
#: The ``ddp-matrix`` fits: name -> (example options, the checkpoints resumed from).
MATRIX = {
    "bare-on": (["--loader-epochs", "on"], ("end", "mid")),
    "stateful-on": (["--wrap", "stateful", "--build-in-init"], ("end", "mid")),
    "stateful-off": (["--wrap", "stateful", "--loader-epochs", "off"], ("end", "mid")),
    "dataloader-on": (["--wrap", "dataloader"], ("end", "mid")),
    "dataloader-off": (["--wrap", "dataloader", "--loader-epochs", "off"], ("end",)),
}


def run(folder: Path, name: str, *args: str) -> None:
    record = str(folder / f"{name}-{{rank}}.jsonl")
    argv = ["--uri", str(folder / "data.lance"), "--rows", str(ROWS), "--record", record, *args]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lightning_train.fit(lightning_train.parse_args(argv))
    rank = os.environ.get("LOCAL_RANK", "0")
    for warning in caught:
        if "LoaderEpochs" in str(warning.message):
            print(f"warned: {name} rank {rank}: {warning.message}", flush=True)  # noqa: T201


def resumed(folder: Path, kind: str, options: list[str], points: tuple[str, ...]) -> None:
    """``<kind>-full`` (checkpoints at each epoch's end and at step 27), then a fit resumed from
    each of ``points``: ``<kind>-end``, ``<kind>-mid``."""
    checkpoints = folder / f"{kind}-ckpt"
    common = ["--strategy", "ddp", "--checkpoints", str(checkpoints), *options]
    run(folder, f"{kind}-full", *common, "--every-n-steps", "27")
    for point in points:
        run(folder, f"{kind}-{point}", *common, "--resume", str(checkpoints / POINTS[point]))


def main() -> None:
    strategy, folder = sys.argv[1], Path(sys.argv[2])
    if strategy == "ddp_spawn":
        run(
            folder,
            "spawn",
            "--strategy",
            "ddp_spawn",
            "--build-in-init",
            "--checkpoints",
            str(folder / "spawn-ckpt"),
        )
    elif strategy == "ddp":
        resumed(folder, "bare", [], ("end", "mid"))
        options = ["--strategy", "ddp", "--wrap", "dataloader", "--loader-epochs", "off"]
        run(folder, "warned", *options, "--checkpoints", str(folder / "warned-ckpt"))
    else:
        for kind, (options, points) in MATRIX.items():
            resumed(folder, kind, options, points)


if __name__ == "__main__":
    main()
