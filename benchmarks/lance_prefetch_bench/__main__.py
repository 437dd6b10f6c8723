"""``python -m lance_prefetch_bench ...``: the same as ``lance-prefetch-bench ...``."""

import sys

from lance_prefetch_bench._cli import main

if __name__ == "__main__":
    sys.exit(main())
