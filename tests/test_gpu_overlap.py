"""benchmarks/gpu_overlap.py, the prepared GPU check: its arithmetic and verdict with exact
values, and (``make test-system``) a whole run of it on the CPU, where it has no copies to
measure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
try:
    import gpu_overlap
finally:
    sys.path.remove(str(BENCHMARKS))


def test_covered_counts_each_part_of_an_interval_once():
    kernels = [(0.0, 4.0), (2.0, 6.0), (10.0, 12.0)]  # union: [0, 6] and [10, 12]
    assert gpu_overlap.covered([(5.0, 11.0)], kernels) == 2.0  # [5, 6] and [10, 11]
    assert gpu_overlap.covered([(6.0, 10.0)], kernels) == 0.0
    assert gpu_overlap.covered([(1.0, 3.0), (11.0, 14.0)], reversed(kernels)) == 3.0


def test_overlap_share_is_the_copies_time_under_kernels():
    kernels = [(0.0, 10.0)]
    assert gpu_overlap.overlap_share([(2.0, 4.0), (8.0, 12.0)], kernels) == 4.0 / 6.0
    assert gpu_overlap.overlap_share([(20.0, 21.0)], kernels) == 0.0
    assert gpu_overlap.overlap_share([], kernels) is None


@pytest.mark.parametrize(
    "in_order,wait,step_s,read_s,passed,starts",
    [
        (True, 0.004, 0.005, 0.001, True, "PASS: the step waited 0.40% of the time"),
        (True, 0.05, 0.005, 0.001, False, "FAIL: the step waited 5.00% of the time for batches"),
        (True, 0.05, 0.001, 0.005, True, "PASS (input-bound): the step waited 5.00%"),
        (False, 0.0, 0.005, 0.001, False, "FAIL: batches arrived out of the plan's order"),
    ],
)
def test_the_verdict(in_order, wait, step_s, read_s, passed, starts):
    ok, line = gpu_overlap.verdict(
        in_order=in_order, wait_fraction=wait, max_wait=0.01, step_s=step_s, read_s=read_s
    )
    assert ok is passed and line.startswith(starts)


def test_cuda_without_a_gpu_is_refused_with_the_cpu_mode_named(capsys):
    if gpu_overlap.torch.cuda.is_available():
        pytest.fail("this test expects a machine without CUDA (the project's CI)")
    with pytest.raises(SystemExit) as exited:
        gpu_overlap.main([])
    assert exited.value.code == 2
    assert "--device cuda needs a CUDA GPU; pass --device cpu" in capsys.readouterr().err


@pytest.mark.system
def test_a_run_on_the_cpu_reads_every_batch_in_the_plans_order(tmp_path):
    out = tmp_path / "figures.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCHMARKS.parent), str(BENCHMARKS)])}
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "gpu_overlap.py"), "--device", "cpu"]
        + ["--rows", "5000", "--steps", "15", "--step-ms", "2", "--json", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    figures = json.loads(out.read_text())
    assert done.returncode == (0 if figures["passed"] else 1), done.stderr[-2000:]
    assert figures["device"] == "cpu" and figures["batches"] == 15 and figures["in_order"]
    assert figures["copies"] == 0 and figures["overlap"] is None
    assert 0.0 <= figures["wait_fraction"] <= 1.0 and figures["step_ms"] > 0
    assert figures["verdict"] in done.stdout
