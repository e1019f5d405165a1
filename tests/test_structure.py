"""The shape of the package, checked on every ``make test`` (issue 13): no import cycle among
``flowx`` modules, no module too long to read, no constructor with too many parameters, and no
test that leans on the benchmarks.

Cycles are found on the module graph import-linter itself builds (grimp), TYPE_CHECKING imports
included: a cycle hidden behind ``if TYPE_CHECKING`` is still two modules that cannot be read
apart. The limits are the project's (STYLE): 600 lines a module, 8 parameters a constructor.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "flowx"
MAX_MODULE_LINES = 600
MAX_CONSTRUCTOR_PARAMETERS = 8
#: Issue 13 is reshaping these rooms on parallel branches; strict once they are merged.


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (the package is deep enough to trouble recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                found.append(sorted(component))
    return found


def module_graph() -> dict[str, set[str]]:
    """Module → the flowx modules it imports. A package's ``__init__`` re-exporting its own
    submodules is not a cycle worth naming (``flowx.stores`` → ``flowx.stores.records`` →
    ``flowx.stores`` is how Python packages work), so edges into an ancestor package are left
    out; every other edge, TYPE_CHECKING ones included, counts."""
    imports = grimp.build_graph("flowx", include_external_packages=False)
    graph: dict[str, set[str]] = {}
    for module in imports.modules:
        graph[module] = {
            target
            for target in imports.find_modules_directly_imported_by(module)
            if not module.startswith(target + ".")
        }
    return graph


def test_strongly_connected_finds_a_cycle_and_nothing_else() -> None:
    """The detector itself: a two-module cycle is one component, a chain is singletons."""
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": set(), "d": {"c"}}
    assert sorted(strongly_connected(graph)) == [["a", "b"], ["c"], ["d"]]


def test_no_import_cycle_among_flowx_modules() -> None:
    cycles = [c for c in strongly_connected(module_graph()) if len(c) > 1]
    assert not cycles, "import cycles among flowx modules:\n" + "\n".join(
        " <-> ".join(cycle) for cycle in cycles
    )


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def test_no_module_over_600_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for path in _modules()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def _constructor_parameters(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """Hand-written ``__init__`` methods (dataclass fields are data, not a call's parameters);
    ``self``, ``*args`` and ``**kwargs`` do not count."""
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        for item in cls.body:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name == "__init__":
                args = item.args
                named = [*args.posonlyargs, *args.args, *args.kwonlyargs]
                yield f"{cls.name}.__init__ (line {item.lineno})", len(named) - 1


def test_no_constructor_over_8_parameters() -> None:
    wide = {
        f"{path.relative_to(ROOT)}: {where}": n
        for path in _modules()
        for where, n in _constructor_parameters(ast.parse(path.read_text()))
        if n > MAX_CONSTRUCTOR_PARAMETERS
    }
    assert not wide, f"constructors over {MAX_CONSTRUCTOR_PARAMETERS} parameters: {wide}"


def _imports_of(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def test_tests_never_import_the_benchmarks() -> None:
    """The benchmarks may borrow test servers and fault tools; the other way round would make a
    test depend on code that is tuned for measuring, not for asserting (issue 13). A test that
    needs a benchmark runs it as a program (``tests/chaos``)."""
    leaning = {
        str(path.relative_to(ROOT)): name
        for path in sorted((ROOT / "tests").rglob("*.py"))
        for name in _imports_of(path)
        if name == "benchmarks" or name.startswith("benchmarks.")
    }
    assert not leaning, f"tests that import benchmarks: {leaning}"


def test_the_testing_contract_names_every_part_of_the_library() -> None:
    """``pyproject.toml`` lists, by name, the modules that must never import ``flowx.testing``
    (import-linter cannot say "all but one"): a new top-level module must join that list."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c.get("forbidden_modules") == ["flowx.testing"]]
    top_level = {
        f"flowx.{path.stem if path.is_file() else path.name}"
        for path in SRC.iterdir()
        if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").exists()
    }
    missing = top_level - {"flowx.testing"} - set(contract["source_modules"])
    assert not missing, f"add to the flowx.testing contract in pyproject.toml: {sorted(missing)}"
