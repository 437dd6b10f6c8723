"""The docs stay true: docs/frameworks.md's and docs/guide.md's ``<!-- run -->`` snippets and the
README's example run as they are, and every line of frameworks.md's ``<!-- excerpt: path -->``
snippets is a line of that example (which test_frameworks.py runs under the real framework); every
test docs/reliability.md cites exists; the README stays a short first screen; every page is in the
site's nav and every public name on an API reference page; docs/stats.md lists every figure of
``LoaderStats`` and quotes its example."""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path

import pytest
import torch

import lance_prefetch

ROOT = Path(__file__).parents[1]
PAGE = ROOT / "docs" / "frameworks.md"
BLOCK = re.compile(r"<!-- (run|excerpt: (\S+)) -->\n```python\n(.*?)```", re.S)


def blocks(kind: str) -> list[tuple[str | None, str]]:
    found = [
        (m.group(2), m.group(3))
        for m in BLOCK.finditer(PAGE.read_text())
        if m.group(1).split(":")[0] == kind
    ]
    assert found, f"no {kind} snippet in {PAGE.name}"
    return found


@pytest.mark.parametrize("path, code", blocks("excerpt"), ids=lambda v: str(v)[:40])
def test_excerpts_are_lines_of_their_example(path, code):
    source = {line.strip() for line in (ROOT / path).read_text().splitlines()}
    missing = [line for line in code.splitlines() if line.strip() and line.strip() not in source]
    assert missing == [], f"lines of docs/frameworks.md not in {path}"


def _snippets():
    """The runnable snippets; the StatefulDataLoader one starts DataLoader workers (system)."""
    stateful, *rest = blocks("run")
    return [pytest.param(*stateful, marks=pytest.mark.system), *rest]


@pytest.mark.slow
@pytest.mark.parametrize("path, code", _snippets(), ids=["stateful", "datasets", "device"])
def test_snippets_run(path, code):
    """Each runs as a script would (its own globals; warnings shown, not errors), here, where
    torch and Lance are imported already; its asserts are the test."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(code, str(PAGE), "exec"), {"__name__": "__docs__"})


README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "guide.md"


def test_guide_snippets_run():
    """docs/guide.md's ``<!-- run -->`` snippets (column types: tensors, blobs, structs; in
    process, a few rows in a temporary folder) run as a script would; their asserts are the test."""
    found = [m.group(3) for m in BLOCK.finditer(GUIDE.read_text()) if m.group(1) == "run"]
    assert found, "no run snippet in docs/guide.md"
    for code in found:
        exec(compile(code, str(GUIDE), "exec"), {"__name__": "__docs__"})


def test_readme_is_a_short_first_screen():
    """Under 10,000 characters, with ``pip install`` and the Python example before "Develop"
    (where ``make demo`` and ``make test`` stay)."""
    text = README.read_text()
    assert len(text) < 10_000, f"README.md has {len(text)} characters"
    develop = text.index("\n## Develop\n")
    assert "pip install ." in text[:develop]
    assert "```python\nfrom lance_prefetch import PrefetchLoader" in text[:develop]
    assert "make demo" in text[develop:] and "make test" in text[develop:]


def test_readme_example_runs(tmp_path, monkeypatch):
    """The README's example, as written, over examples/classification_data.py's dataset (1,000
    rows of 16 features and a label) written as ``data.lance`` in the working folder: three
    epochs of three 256-row batches, each epoch a new permutation, the shapes its comment gives."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from classification_data import write_dataset
    finally:
        sys.path.remove(str(ROOT / "examples"))
    monkeypatch.chdir(tmp_path)
    write_dataset("data.lance", 1000)
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    step = "...  # the training step"
    assert step in code
    seen = []
    code = code.replace(step, "seen.append((epoch, features, labels))")
    exec(compile(code, str(README), "exec"), {"__name__": "__docs__", "seen": seen})
    assert [epoch for epoch, _, _ in seen] == [0] * 3 + [1] * 3 + [2] * 3
    for _, features, labels in seen:
        assert features.shape == (256, 16) and features.dtype == torch.float32
        assert labels.shape == (256,) and labels.dtype == torch.int64
    firsts = [seen[i][1][0].tolist() for i in (0, 3, 6)]
    assert firsts[0] != firsts[1] != firsts[2], "the epochs should be new permutations"


def test_every_page_is_in_the_site_nav():
    """Each docs/ page is a chapter of mkdocs.yml's nav (a page left out is built but unreachable)."""
    nav = set(re.findall(r"^\s+- [^:]+: (\S+\.md)$", (ROOT / "mkdocs.yml").read_text(), re.M))
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert pages - nav == set(), "pages missing from mkdocs.yml's nav"
    assert nav - pages == set(), "nav entries with no page"


def test_every_public_name_is_on_a_reference_page():
    """``::: lance_prefetch.NAME`` for each name of ``lance_prefetch.__all__`` (``__version__``: named
    in the reference's text)."""
    reference = "".join(p.read_text() for p in (ROOT / "docs" / "reference").glob("*.md"))
    documented = set(re.findall(r"^::: lance_prefetch\.(\w+)$", reference, re.M))
    expected = set(lance_prefetch.__all__) - {"__version__"}
    assert expected - documented == set(), "public names without a reference entry"
    assert "`lance_prefetch.__version__`" in reference


RELIABILITY = ROOT / "docs" / "reliability.md"
SPAN = re.compile(r"`([^`\n]+)`")
# `test_x.py`, `tests/test_x.py::test_y`, `::test_y` (the line's last file), `[param]` (the line's
# last test), `test_y[param]`, and a bare `test_y` (defined in some test file)
CITE = re.compile(r"(?:tests/)?(test_\w+\.py)?(?:(?:^|::)(test_\w+))?(\[[^\]]+\])?")


def cited_tests() -> list[tuple[int, str | None, str | None, str | None]]:
    """(line, file, test, param id) for every test docs/reliability.md cites, as the page spells
    it; file None: a bare test name; test None: the whole file."""
    found = []
    for number, line in enumerate(RELIABILITY.read_text().splitlines(), 1):
        file = test = None
        for span in SPAN.findall(line):
            m = CITE.fullmatch(span)
            if not m or not any(m.groups()):
                continue
            cited_file, cited_test, param = m.groups()
            if cited_file:  # a file starts a new citation
                file, test = cited_file, cited_test
            elif span.startswith("::"):  # `::test_y`: the line's last file
                assert file, f"reliability.md:{number}: {span} follows no test_x.py"
                test = cited_test
            elif cited_test:  # a bare name
                file, test = None, cited_test
            elif not test:  # `[...]` on a line citing no test: not a citation
                continue
            found.append((number, file, test, param and param[1:-1]))
    return found


def test_every_test_reliability_md_cites_exists():
    """A test renamed or removed (or a parameter id changed) fails here until the page names it
    again: the file exists under tests/ and has a ``def test_y(``, and the id is a string in it."""
    sources = {path.name: path.read_text() for path in (ROOT / "tests").glob("test_*.py")}
    cited = cited_tests()
    assert len(cited) > 50, "few citations found: has the page's form changed?"
    broken = []
    for number, file, test, param in cited:
        if file is not None and file not in sources:
            broken.append(f"line {number}: tests/{file} does not exist")
            continue
        defines = re.compile(rf"^\s*(async )?def {test}\(", re.M)
        where = [file] if file else [name for name in sources if defines.search(sources[name])]
        if test and not (where and defines.search(sources[where[0]])):
            broken.append(f"line {number}: no def {test}( in {file or 'any test file'}")
        elif param and f'"{param}"' not in sources[where[0]]:
            broken.append(f"line {number}: {file}::{test} has no parameter {param!r}")
    assert broken == [], "docs/reliability.md cites tests that are gone:\n" + "\n".join(broken)


def test_the_links_to_reliability_md_sections_resolve():
    """Its own ``(#section)`` links (the at-a-glance table's), and the README's and the guide's
    ``reliability.md#...``."""
    page = RELIABILITY.read_text()
    slugs = {
        re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        for title in re.findall(r"^#{2,} (.+)$", page, re.M)
    }
    links = re.findall(r"\]\(#([\w-]+)\)", page)
    for other in (README, GUIDE):
        links += re.findall(r"reliability\.md#([\w-]+)", other.read_text())
    assert len(links) > 20, "few links found: has the page's form changed?"
    missing = sorted(set(links) - slugs)
    assert missing == [], f"links to no section of docs/reliability.md: {missing}"


STATS = ROOT / "docs" / "stats.md"


def test_stats_page_lists_every_key_of_to_dict_in_order():
    """docs/stats.md's table of figures has one row per ``LoaderStats.to_dict()`` key, in order."""
    from lance_prefetch import LoaderStats

    rows = re.findall(r"^\| `(\w+)` \|", STATS.read_text(), re.M)
    assert rows == list(LoaderStats().to_dict())


def test_stats_page_excerpts_are_lines_of_their_example():
    found = [(m.group(2), m.group(3)) for m in BLOCK.finditer(STATS.read_text()) if m.group(2)]
    assert [path for path, _ in found] == ["examples/tensorboard_stats.py"]
    for path, code in found:
        source = {line.strip() for line in (ROOT / path).read_text().splitlines()}
        assert [line for line in code.splitlines() if line.strip() not in source] == []
