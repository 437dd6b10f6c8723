"""The shape of the code: no import cycle and no keyword arguments forwarded blindly inside the
library. (A module is as long as its job needs: a line cap only measured formatting.)"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import lance_prefetch

PACKAGE = pathlib.Path(lance_prefetch.__file__).parent


def modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports, anywhere in it (function bodies included).
    ``from . import x`` counts as importing ``x``, not the package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            submodules = {f"{target}.{alias.name}" for alias in node.names} & known
            found |= submodules or ({target} & known)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names} & known
    return found - {name}


def test_there_is_no_import_cycle():
    known = modules()
    graph = {name: imports(name, path, set(known)) for name, path in known.items()}
    # a package's __init__ re-exports its modules: an import of the package face is not a cycle
    faces = {"lance_prefetch"}
    cycles, state = [], {}

    def visit(name, stack):
        state[name] = "open"
        for target in sorted(graph[name] - faces):
            if state.get(target) == "open":
                cycles.append(stack[stack.index(target) :] + [target])
            elif target not in state:
                visit(target, [*stack, target])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def test_no_keyword_arguments_are_forwarded_blindly():
    """No ``**kwargs`` parameter anywhere in the library: every option is named."""
    found = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.args.kwarg:
                found.append(f"{name}.{node.name}(**{node.args.kwarg.arg})")
    assert found == []


def test_the_layers_hold():
    """import-linter's contracts (pyproject.toml): each wing imports only the wings below it,
    planning imports no I/O, scheduling no Lance, and only the sources call Lance."""
    linter = pathlib.Path(sys.executable).with_name("lint-imports")
    run = subprocess.run([str(linter)], cwd=PACKAGE.parent, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "4 kept, 0 broken" in run.stdout


def test_no_code_is_kept_from_the_formatter():
    """No line is kept from ``ruff format`` by a skip or off marker: it lays out every line."""
    markers = ("fmt: " + "skip", "fmt: " + "off")  # spelt apart, so that this file holds neither
    marked = [
        f"{path.relative_to(PACKAGE.parent)}:{number}"
        for folder in ("lance_prefetch", "tests", "benchmarks", "examples")
        for path in sorted((PACKAGE.parent / folder).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if any(marker in line for marker in markers)
    ]
    assert marked == []
