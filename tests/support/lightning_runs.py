"""Several ``trainer.fit`` runs of examples/lightning_train.py in one launch (Lightning starts its
``ddp`` processes once; later Trainers find them), for tests/test_frameworks.py.

    python lightning_runs.py ddp <folder>        # 6 fits: bare and StatefulDataLoader, resumed
    python lightning_runs.py ddp_spawn <folder>  # 1 fit, loaders built in __init__

Each fit records its batches in ``<folder>/<name>-<rank>.jsonl``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "examples"))

import lightning_train  # noqa: E402

ROWS = 403


def run(folder: Path, name: str, *args: str) -> None:
    lightning_train.fit(lightning_train.parse_args([
        "--uri", str(folder / "data.lance"), "--rows", str(ROWS),
        "--record", str(folder / f"{name}-{{rank}}.jsonl"), *args,
    ]))  # fmt: skip


def main() -> None:
    strategy, folder = sys.argv[1], Path(sys.argv[2])
    if strategy == "ddp_spawn":
        run(folder, "spawn", "--strategy", "ddp_spawn", "--build-in-init",
            "--checkpoints", str(folder / "spawn-ckpt"))  # fmt: skip
        return
    for kind, options in (("bare", []), ("stateful", ["--stateful", "--build-in-init"])):
        checkpoints = folder / f"{kind}-ckpt"
        common = ["--strategy", "ddp", "--checkpoints", str(checkpoints), *options]
        run(folder, f"{kind}-full", *common, "--every-n-steps", "27")
        for point, checkpoint in (("end", "end-epoch=0.ckpt"), ("mid", "step-step=27.ckpt")):
            resumed = ["--resume", str(checkpoints / checkpoint)]
            run(folder, f"{kind}-{point}", *common, *resumed)


if __name__ == "__main__":
    main()
