"""Run one contender in a fresh process and watch it: progress ticks, memory, time limit."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from lance_prefetch_bench._process import ManagedProcess
from lance_prefetch_bench._spec import ContenderSpec

_MIB = 2**20
POLL_S = 0.1


def _tree_rss_mib(root: psutil.Process) -> float:
    """Resident memory of ``root`` and all its descendants, in MiB (0 if it is gone)."""
    total = 0
    try:
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    for process in processes:
        try:
            total += process.memory_info().rss
        except psutil.Error:
            pass
    return total / _MIB


def _log_tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:].strip()
    except OSError:
        return ""


def run_isolated(
    spec: ContenderSpec,
    *,
    workdir: Path,
    tag: str,
    env: dict[str, str],
    progress: Callable[[int], None],
    timeout_s: float,
) -> dict[str, Any]:
    """Run ``spec`` in a new process (``python -m lance_prefetch_bench._worker``) and wait for it.

    Its process tree's resident memory is sampled every 0.1 s; ``peak_rss_mib`` in the result is the
    largest sum seen (or the process's own exact peak, if larger). Stopped (with its DataLoader
    workers) when it ends, fails, exceeds ``timeout_s`` or this process is interrupted.

    Returns:
        dict: the contender's result (see :func:`~lance_prefetch_bench.contenders.run_contender`)
        plus ``peak_rss_mib``, ``wall_s`` and ``pid``, or ``{"error": message, "log": stderr
        tail, "wall_s", "pid"}``.
    """
    spec_path, result_path = workdir / f"{tag}.spec.json", workdir / f"{tag}.result.json"
    log_path = workdir / f"{tag}.log"
    spec_path.write_text(json.dumps(spec.to_dict()))
    started = time.monotonic()
    with open(log_path, "wb") as log:
        process = ManagedProcess(
            [
                sys.executable,
                "-m",
                "lance_prefetch_bench._worker",
                str(spec_path),
                str(result_path),
            ],
            name=f"contender {tag}",
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
        )
    timed_out = False
    peak = 0.0
    try:
        reader = threading.Thread(
            target=_count_ticks, args=(process.popen.stdout, progress), daemon=True
        )
        reader.start()
        root = psutil.Process(process.pid)
        while process.poll() is None:
            peak = max(peak, _tree_rss_mib(root))
            if time.monotonic() - started > timeout_s:
                timed_out = True
                break
            time.sleep(POLL_S)
        if not timed_out:
            reader.join(timeout=2.0)  # the last ticks, up to end of file
    finally:
        code = process.stop()
    wall_s = time.monotonic() - started
    if timed_out:
        return {
            "error": f"timed out after {timeout_s:g} s and was stopped",
            "wall_s": wall_s,
            "pid": process.pid,
        }
    try:
        result = json.loads(result_path.read_text())
    except (OSError, ValueError):
        return {
            "error": f"the contender's process exited with code {code} without a result",
            "log": _log_tail(log_path),
            "wall_s": wall_s,
            "pid": process.pid,
        }
    if "error" in result:
        result["log"] = _log_tail(log_path)
        result["pid"] = process.pid
    result["peak_rss_mib"] = max(peak, result.get("peak_rss_self_mib") or 0.0)
    result["wall_s"] = wall_s
    result["pid"] = process.pid
    return result


def _count_ticks(stream, progress: Callable[[int], None]) -> None:
    try:
        for line in stream:
            if line == b"t\n":
                progress(1)
    except (OSError, ValueError):  # the stream was closed under us: the process was stopped
        pass
