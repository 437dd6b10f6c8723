"""examples/ray_data_preprocess.py for tests/test_recipes.py: preprocess 100 raw rows with Ray
Data, then read 2 epochs; the last line printed is each epoch's batches of ids (JSON).

    python ray_data_runs.py <raw uri> <output uri>
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

EXAMPLES = Path(__file__).parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))
# Ray's workers import the example's functions by module name: they find it on their PYTHONPATH
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(EXAMPLES), os.getenv("PYTHONPATH")]))

import ray_data_preprocess  # noqa: E402


def main() -> None:
    raw, out = sys.argv[1:3]
    epochs = ray_data_preprocess.main(ray_data_preprocess.parse_args(["--raw", raw, "--out", out]))
    print(json.dumps(epochs))  # noqa: T201


if __name__ == "__main__":
    main()
