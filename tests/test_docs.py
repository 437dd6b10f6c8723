"""docs/frameworks.md stays true: its ``<!-- run -->`` snippets run as they are, and every line of
its ``<!-- excerpt: path -->`` snippets is a line of that example (which test_frameworks.py
runs under the real framework)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PAGE = ROOT / "docs" / "frameworks.md"
BLOCK = re.compile(r"<!-- (run|excerpt: (\S+)) -->\n```python\n(.*?)```", re.S)


def blocks(kind: str) -> list[tuple[str | None, str]]:
    found = [(m.group(2), m.group(3)) for m in BLOCK.finditer(PAGE.read_text())
             if m.group(1).split(":")[0] == kind]  # fmt: skip
    assert found, f"no {kind} snippet in {PAGE.name}"
    return found


@pytest.mark.parametrize("path, code", blocks("excerpt"), ids=lambda v: str(v)[:40])
def test_excerpts_are_lines_of_their_example(path, code):
    source = {line.strip() for line in (ROOT / path).read_text().splitlines()}
    missing = [line for line in code.splitlines() if line.strip() and line.strip() not in source]
    assert missing == [], f"lines of docs/frameworks.md not in {path}"


@pytest.mark.slow
@pytest.mark.parametrize("path, code", blocks("run"), ids=["stateful", "datasets", "device"])
def test_snippets_run(path, code):
    """Each runs as a script would (its own globals; warnings shown, not errors), here, where
    torch and Lance are imported already; its asserts are the test."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(code, str(PAGE), "exec"), {"__name__": "__docs__"})
