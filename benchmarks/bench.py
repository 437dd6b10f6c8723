"""``python benchmarks/bench.py ...``: the same as ``lance-prefetch-bench ...``, from a checkout
where the bench is not installed (this directory is then on ``sys.path``, so its
``lance_prefetch_bench`` package is found). Run ``python benchmarks/bench.py --help`` for the
arguments, and see ``docs/benchmarks.md`` for what it measures.
"""

import sys

from lance_prefetch_bench._cli import main

if __name__ == "__main__":
    sys.exit(main())
