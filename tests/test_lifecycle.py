"""Process-level lifecycle: a training script that breaks, fails or is interrupted exits cleanly.

Each case runs a real script in a subprocess with a hard timeout, so a hang fails the test instead
of the run. A thread left inside (or merely having run) a Lance ``take`` when the interpreter
finalizes makes the process abort with "terminate called without an active exception" (exit code
134); these tests repeat each case because that abort is timing-dependent.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pyarrow as pa
import pytest

SCRIPT = textwrap.dedent(
    """
    import sys, threading, time
    from lance_prefetch import PrefetchLoader

    loader = PrefetchLoader(sys.argv[1], 512, readahead=8, max_in_flight=4)
    mode = sys.argv[2]
    if mode == "break":
        for batch in loader:
            break
    elif mode == "raise":
        for batch in loader:
            raise ValueError("the training step failed")
    elif mode == "with":
        with loader:
            for batch in loader:
                break
    elif mode == "sigint":
        for batch in loader:
            print("step", flush=True)
            time.sleep(30)  # a long training step, interrupted by Ctrl-C
    left = [t.name for t in threading.enumerate() if t.name == "lance-prefetch-loop"]
    print("loop threads left:", left, flush=True)
    """
)


@pytest.fixture(scope="module")
def wide_dataset(tmp_path_factory):
    """6,000 rows of 256 float32 (6 MB) in 6 fragments: takes that are still running at a break."""
    import lance

    rows = 6000
    values = np.random.default_rng(0).random(rows * 256, dtype=np.float32)
    table = pa.table(
        {
            "id": np.arange(rows),
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(values), 256),
        }
    )
    path = tmp_path_factory.mktemp("wide") / "wide.lance"
    lance.write_dataset(table, str(path), max_rows_per_file=1000)
    return str(path)


def run_script(tmp_path, uri: str, mode: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    return subprocess.run(
        [sys.executable, str(script), uri, mode],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.parametrize("mode,expected_code", [("break", 0), ("with", 0), ("raise", 1)])
def test_script_exits_cleanly(tmp_path, wide_dataset, mode, expected_code):
    """Three runs each: the exit code is the script's own, with no abort and no thread left."""
    for _ in range(3):
        result = run_script(tmp_path, wide_dataset, mode)
        assert result.returncode == expected_code, result.stderr[-2000:]
        assert "terminate called" not in result.stderr
        assert "Fatal Python error" not in result.stderr
        if mode == "raise":
            assert result.stderr.rstrip().endswith("ValueError: the training step failed")
        else:
            assert "loop threads left: []" in result.stdout


@pytest.mark.slow
def test_ctrl_c_during_a_training_step_exits_promptly(tmp_path, wide_dataset):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    process = subprocess.Popen(
        [sys.executable, str(script), wide_dataset, "sigint"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout.readline() == "step\n"
        time.sleep(0.2)  # reads of the next batches are in flight or done
        started = time.monotonic()
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
        elapsed = time.monotonic() - started
    finally:
        process.kill()
    assert elapsed < 10
    assert "KeyboardInterrupt" in stderr
    assert "terminate called" not in stderr and "Fatal Python error" not in stderr
    assert process.returncode in (-signal.SIGINT, 130, 1)
