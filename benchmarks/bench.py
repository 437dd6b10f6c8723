"""``python benchmarks/bench.py ...``: the same as ``lance-prefetch bench ...``.

The benchmark lives in the package (:mod:`lance_prefetch._bench`) so that the installed command has
it; this file only forwards its arguments. Run ``python benchmarks/bench.py --help`` for them, and
see ``docs/benchmarks.md`` for what it measures.
"""

import sys

from lance_prefetch._cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
