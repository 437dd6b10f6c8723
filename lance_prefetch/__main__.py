"""``python -m lance_prefetch``: the same as the ``lance-prefetch`` command."""

import sys

from .cli import main

sys.exit(main())
