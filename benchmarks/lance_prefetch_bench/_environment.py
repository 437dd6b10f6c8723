"""What the report says about the run's surroundings: machine, versions, load."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["load_average", "machine", "nginx_version", "rclone_version", "versions"]


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, e.g. ``"0.52 0.61 0.70"`` (other work on the machine)."""
    try:
        return " ".join(f"{value:.2f}" for value in os.getloadavg())
    except OSError:  # pragma: no cover
        return "n/a"


def machine() -> dict[str, Any]:
    """CPU model, cores, memory (GiB), platform, and a one-line ``summary``."""
    import psutil

    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory_gib = psutil.virtual_memory().total / 2**30
    cores = os.cpu_count()
    return {
        "cpu": model,
        "cores": cores,
        "memory_gib": round(memory_gib, 1),
        "platform": platform.platform(),
        "summary": f"{cores} cores ({model}), {memory_gib:.0f} GiB, {platform.system()} "
        f"{platform.release()}",
    }


def versions(local_s3: bool) -> dict[str, str]:
    """Versions of Python and the libraries measured (and of nginx and rclone with ``local_s3``)."""
    import lance
    import numpy
    import pyarrow
    import torch

    from lance_prefetch import __version__

    versions = {
        "python": platform.python_version(),
        "lance-prefetch": __version__,
        "pylance": lance.__version__,
        "pyarrow": pyarrow.__version__,
        "torch": torch.__version__,
        "numpy": numpy.__version__,
    }
    if local_s3:
        versions["nginx"] = nginx_version()
        versions["rclone"] = rclone_version()
    return versions


def nginx_version() -> str:
    """nginx's version, e.g. ``"1.22.1"`` (``"unknown"`` if it cannot be run)."""
    from lance_prefetch_bench.local_s3 import find_nginx

    with contextlib.suppress(OSError, FileNotFoundError, subprocess.SubprocessError):
        out = subprocess.run(
            [find_nginx(), "-v"], capture_output=True, text=True, timeout=10, check=False
        )
        return out.stderr.strip().rsplit("/", 1)[-1]
    return "unknown"


def rclone_version() -> str:
    """rclone's version, e.g. ``"v1.75.2"`` (``"unknown"`` if it cannot be run)."""
    from lance_prefetch_bench.local_s3 import find_rclone

    with contextlib.suppress(OSError, FileNotFoundError, subprocess.SubprocessError):
        out = subprocess.run(
            [find_rclone(), "version"], capture_output=True, text=True, timeout=10, check=False
        )
        return out.stdout.split("\n", 1)[0].replace("rclone ", "").strip()
    return "unknown"
