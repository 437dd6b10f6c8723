"""Portable imports: the loader's import path and its disk cache need no POSIX-only module (the
disk cache's lock goes through ``filelock``), so ``import lance_prefetch`` works where ``fcntl``
and the like do not exist (Windows)."""

from __future__ import annotations

import json
import subprocess
import sys

from support.helpers import checkout_env

#: Modules Windows' Python lacks. The standard library imports some of them under guards (asyncio
#: through subprocess tries ``fcntl``), so blocking them shows what the package itself needs.
POSIX_ONLY = ["fcntl", "termios", "resource", "pwd", "grp"]

CHILD = """
import json, sys
for name in {blocked!r}:
    sys.modules[name] = None  # `import name` now raises ImportError
try:
    import fcntl
except ImportError:
    blocked = True
else:
    blocked = False

import lance_prefetch

ids = {{}}
for cache in (None, "disk"):
    loader = lance_prefetch.PrefetchLoader({uri!r}, batch_size=5, seed=3, cache=cache)
    ids[str(cache)] = [batch["id"].tolist() for batch in loader]
    if cache == "disk":
        loader._source.fill()  # the copy made in the background while the epoch was read
print(json.dumps({{"blocked": blocked, "ids": ids}}))
"""


def test_the_package_imports_and_reads_without_posix_only_modules(ids_25, tmp_path):
    child = CHILD.format(blocked=POSIX_ONLY, uri=ids_25)
    env = dict(checkout_env(), LANCE_PREFETCH_CACHE_DIR=str(tmp_path / "cache"))
    result = subprocess.run(
        [sys.executable, "-c", child],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["blocked"] is True
    # the same seed gives the same shuffled epoch from the dataset and from its disk copy
    assert out["ids"]["None"] == out["ids"]["disk"]
    assert [len(batch) for batch in out["ids"]["disk"]] == [5, 5, 5, 5, 5]
    assert sorted(i for batch in out["ids"]["disk"] for i in batch) == list(range(25))
    assert out["ids"]["disk"] != [list(range(i, i + 5)) for i in range(0, 25, 5)]
    # the disk copy was made in the folder given (under filelock's lock: without fcntl here,
    # its lock file is gone once released; with fcntl or on Windows, an OS lock)
    made = [path.suffix for path in (tmp_path / "cache").iterdir() if path.suffix != ".lock"]
    assert made == [".lance"]
