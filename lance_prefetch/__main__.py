"""``python -m lance_prefetch``: the same as the ``lance-prefetch`` command."""

import sys

from lance_prefetch._cli import main

sys.exit(main())
