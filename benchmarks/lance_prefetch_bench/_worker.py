"""A contender's process: ``python -m lance_prefetch_bench._worker SPEC.json RESULT.json``.

Runs one :class:`~lance_prefetch_bench._spec.ContenderSpec`, writes one line ``t`` to stdout
per timed batch (the parent's progress bar) and the result, or ``{"error": ..., "traceback": ...}``,
to ``RESULT.json``. Exit status 0 on success, 1 on an error.
"""

from __future__ import annotations

import json
import os
import sys
import traceback


def _tick() -> None:
    os.write(1, b"t\n")


def main(argv: list[str]) -> int:
    spec_path, result_path = argv
    from lance_prefetch_bench._spec import ContenderSpec
    from lance_prefetch_bench.contenders import run_contender

    with open(spec_path) as file:
        spec = ContenderSpec(**json.load(file))
    try:
        result = run_contender(spec, _tick)
        status = 0
    except Exception as exc:
        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        status = 1
    with open(result_path + ".tmp", "w") as file:
        json.dump(result, file)
    os.replace(result_path + ".tmp", result_path)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
