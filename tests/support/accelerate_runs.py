"""examples/accelerate_train.py twice in one ``torchrun`` launch, for tests/test_frameworks.py:
with Accelerate's default dispatcher and one spawn DataLoader worker per process, then with
``dispatch_batches=False``. Each run records its batches in ``<folder>/<name>-<rank>.jsonl``.

    torchrun --nproc_per_node 2 accelerate_runs.py <folder>
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "examples"))

import accelerate_train  # noqa: E402

ROWS = 403


def main() -> None:
    folder = Path(sys.argv[1])
    for name, options in (("dispatched", ["--num-workers", "1"]), ("sharded", ["--no-dispatch"])):
        accelerate_train.train(
            accelerate_train.parse_args(
                [
                    "--uri",
                    str(folder / "data.lance"),
                    "--rows",
                    str(ROWS),
                    "--record",
                    str(folder / f"{name}-{{rank}}.jsonl"),
                    *options,
                ]
            )
        )


if __name__ == "__main__":
    main()
