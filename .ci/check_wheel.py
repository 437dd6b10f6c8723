"""`make package`'s check of what `python -m build` left in dist/: the wheel and the sdist hold
the library with its PEP 561 marker and its LICENSE and no bench, and the wheel, installed into a
fresh venv, imports and reads a dataset there.

The fresh venv (``python -m venv``, no system site-packages) gets the wheel with ``pip install
--no-deps --no-index``: the library's files are the wheel's alone. Its dependencies (torch,
pylance, pyarrow, ...: gigabytes, and no network in some CI runners) come from the development
venv's site-packages through a ``.pth`` line; that directory's own ``.pth`` files are not run, so
the checkout's editable ``lance_prefetch`` stays out of sight, and the check asserts the module
imported is the venv's. The smoke run's working directory is outside the checkout.

Usage: python .ci/check_wheel.py DIST_DIR
"""

from __future__ import annotations

import email
import json
import os
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import venv
import zipfile
from pathlib import Path

SMOKE = """
import json, sys, tempfile
from pathlib import Path
import lance, pyarrow as pa
import lance_prefetch
from lance_prefetch import PrefetchLoader

with tempfile.TemporaryDirectory() as folder:
    uri = str(Path(folder) / "ids.lance")
    lance.write_dataset(pa.table({"id": pa.array(range(20), pa.int64())}), uri)
    loader = PrefetchLoader(uri, batch_size=4, seed=1)
    ids = [batch["id"].tolist() for batch in loader]
print(json.dumps({"file": lance_prefetch.__file__, "ids": ids}))
"""


def fail(message: str) -> None:
    sys.exit(f"check_wheel: {message}")


def check_wheel(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = next(name.split("/")[0] for name in names if ".dist-info/" in name)
        metadata = email.message_from_bytes(archive.read(f"{info}/METADATA"))
    tops = {name.split("/")[0] for name in names} - {info}
    if tops != {"lance_prefetch"}:
        fail(f"{wheel.name} holds {sorted(tops)}, not the library alone")
    if "lance_prefetch/py.typed" not in names:
        fail(f"{wheel.name} lacks lance_prefetch/py.typed")
    if f"{info}/licenses/LICENSE" not in names:
        fail(f"{wheel.name} lacks {info}/licenses/LICENSE")
    if metadata["License-Expression"] != "Apache-2.0":
        fail(f"{wheel.name}: License-Expression is {metadata['License-Expression']!r}")
    if "Typing :: Typed" not in metadata.get_all("Classifier", []):
        fail(f"{wheel.name}: no 'Typing :: Typed' classifier")


def check_sdist(sdist: Path) -> None:
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    for needed in ("LICENSE", "pyproject.toml", "lance_prefetch/py.typed"):
        if needed not in names:
            fail(f"{sdist.name} lacks {needed}")


def smoke(wheel: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="lance-prefetch-wheel-") as folder:
        env_dir = Path(folder) / "venv"
        venv.create(env_dir, with_pip=True)
        python = env_dir / "bin" / "python"
        subprocess.run(
            [python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", wheel],
            check=True,
        )
        paths = sysconfig.get_paths()
        site = subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        deps = dict.fromkeys([paths["purelib"], paths["platlib"]])
        Path(site, "_dependencies.pth").write_text("".join(f"{path}\n" for path in deps))
        env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
        result = subprocess.run(
            [python, "-c", SMOKE],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if result.returncode != 0:
            fail(f"the smoke run in the fresh venv failed:\n{result.stderr[-3000:]}")
        out = json.loads(result.stdout.strip().splitlines()[-1])
        if not out["file"].startswith(site):
            fail(f"the smoke run imported {out['file']}, not the wheel installed in {site}")
        ids = sorted(i for batch in out["ids"] for i in batch)
        if ids != list(range(20)) or [len(b) for b in out["ids"]] != [4] * 5:
            fail(f"the smoke run read {out['ids']}, not 20 rows in 5 batches of 4")
        sys.stdout.write(
            f"check_wheel: {wheel.name} imports from {out['file']}, read {out['ids']}\n"
        )


def main() -> None:
    dist = Path(sys.argv[1])
    wheels = sorted(dist.glob("lance_prefetch-*.whl"))
    sdists = sorted(dist.glob("lance_prefetch-*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        fail(f"{dist} holds wheels {wheels} and sdists {sdists}, not one of each")
    check_wheel(wheels[0])
    check_sdist(sdists[0])
    smoke(wheels[0])


if __name__ == "__main__":
    main()
