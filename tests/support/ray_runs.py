"""Several ``TorchTrainer`` fits of examples/ray_train.py on one local Ray cluster (it starts
once), for tests/test_frameworks.py.

    python ray_runs.py <folder> both+prepare both driver+prepare ...

Each argument names a fit: where the loader is built (``--build``: ``driver``, ``loop`` or
``both``), and ``+prepare`` for ``--prepare-data-loader``. Every fit fails after 27 steps (epoch 1,
batch 7), with a checkpoint reported at that step, and is restarted from it; it records its
batches in ``<folder>/<name>-<rank>.jsonl`` and has its own Ray Train storage folder.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

EXAMPLES = Path(__file__).parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))
# Ray's processes import the example's module (train_loop is pickled by reference)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(EXAMPLES), os.getenv("PYTHONPATH")]))

import ray  # noqa: E402
import ray_train  # noqa: E402

ROWS = 403


def main() -> None:
    folder, names = Path(sys.argv[1]), sys.argv[2:]
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    for name in names:
        build, _, prepare = name.partition("+")
        options = {
            "--uri": folder / "data.lance",
            "--rows": ROWS,
            "--build": build,
            "--storage": folder / f"runs-{name}",
            "--stop-after": 27,
            "--checkpoint-every": 10,
            "--record": folder / f"{name}-{{rank}}.jsonl",
        }
        argv = [str(item) for pair in options.items() for item in pair]
        args = ray_train.parse_args(argv + (["--prepare-data-loader"] if prepare else []))
        sys.stdout.write(f"{name}: ")
        sys.stdout.flush()
        ray_train.fit(args)
    ray.shutdown()


if __name__ == "__main__":
    main()
