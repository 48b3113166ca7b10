"""The package's import graph: layers import only downwards, and no two modules import each other.

Every module of ``fedlightning`` is parsed with :mod:`ast` (nothing is imported), and every
``import`` statement counts: at module level, inside functions, and under ``if TYPE_CHECKING:``
for the layer rule (a type is a dependency too). Only the cycle rule leaves ``TYPE_CHECKING``
imports out, since they never run.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fedlightning"

LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"", "errors", "cuda_check", "paths"}),  # "": the package's own __init__
    frozenset({"models", "metrics"}),
    frozenset({"checkpointing", "folder_lock", "run_folder", "loggers", "console", "tracking", "dashboard", "launch"}),
    frozenset({"schema", "jobs", "sweeps"}),
    frozenset({"datamodules"}),
    frozenset({"plotting"}),  # figures of runs and of data splits
    frozenset({"federated"}),
    frozenset({"compression", "sampling"}),
    frozenset({"methods"}),
    frozenset({"callbacks"}),
    frozenset({"run", "preflight", "target_index"}),
    frozenset({"cli"}),
)
"""The layers, lowest first: a module may import its own layer and the layers below it.

A layer is named by the first component under ``fedlightning`` (a subpackage or a top-level module).
"""


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    type_only: bool


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _is_package(name: str) -> bool:
    return MODULES.get(name, Path()).name == "__init__.py"


def _resolve(importer: str, node: ast.ImportFrom) -> list[str]:
    """The package modules a ``from ... import ...`` loads (a name that is a submodule counts as one)."""
    if node.level:
        base = importer.split(".")
        base = base if _is_package(importer) else base[:-1]
        base = base[: len(base) - node.level + 1]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    submodules = [f"{source}.{alias.name}" for alias in node.names if f"{source}.{alias.name}" in MODULES]
    names_from_source = len(submodules) < len(node.names)
    return [source] * names_from_source + submodules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(name: str, source: str | None = None) -> list[Import]:
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8") if source is None else source)
    found: list[Import] = []

    def visit(node: ast.AST, type_only: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, type_only)
            return
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            targets = _resolve(name, node)
        for target in targets:
            if target == "fedlightning" or target.startswith("fedlightning."):
                found.append(Import(name, target, getattr(node, "lineno", 0), type_only))
        for child in ast.iter_child_nodes(node):
            visit(child, type_only)

    visit(tree, False)
    return found


ALL_IMPORTS = [imp for name in MODULES for imp in _imports(name)]


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of a ``fedlightning`` module."""
    top = module.split(".")[1] if "." in module else ""
    for index, layer in enumerate(LAYERS):
        if top in layer:
            return index
    raise AssertionError(f"{module} is in no layer; add {top!r} to LAYERS in {Path(__file__).name}.")


def test_every_module_has_a_layer() -> None:
    for name in MODULES:
        layer_of(name)


def test_no_module_imports_from_a_higher_layer() -> None:
    upward = [
        f"{imp.importer}:{imp.line} imports {imp.imported}"
        for imp in ALL_IMPORTS
        if imp.imported in MODULES and layer_of(imp.imported) > layer_of(imp.importer)
    ]
    assert upward == []


def test_the_runtime_import_graph_has_no_cycle() -> None:
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for imp in ALL_IMPORTS:
        if not imp.type_only and imp.imported in MODULES and imp.imported != imp.importer:
            graph[imp.importer].add(imp.imported)
    cycles = _cycles(graph)
    assert cycles == []


def test_no_module_takes_part_in_import_machinery() -> None:
    """No lazy module attributes (a module-level ``__getattr__``), no import hooks: a name is where its import says."""
    tricks = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.Assign) and "__getattr__" in ast.unparse(node).split("(")[0]:
                tricks.append(f"{name}: module-level __getattr__")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("meta_path", "path_hooks"):
                tricks.append(f"{name}:{node.lineno} uses {ast.unparse(node)}")
    assert tricks == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"a"}, "c": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, [["a", "b", "c"]]),
    ],
)
def test_the_cycle_finder_finds_hand_made_cycles(graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert _cycles(graph) == expected


HAND_MADE = """
from typing import TYPE_CHECKING
import fedlightning.errors
from fedlightning.federated import message
from .. import methods, __version__
if TYPE_CHECKING:
    from fedlightning.callbacks.declared import declared_callbacks
def later():
    from fedlightning.run import run
"""


def test_the_parser_sees_every_kind_of_import() -> None:
    found = {(imp.imported, imp.type_only) for imp in _imports("fedlightning.federated.channel", HAND_MADE)}
    assert found == {
        ("fedlightning.errors", False),
        ("fedlightning.federated.message", False),  # a name that is a submodule is that module
        ("fedlightning", False),  # the relative import (__version__), resolved from fedlightning.federated.channel
        ("fedlightning.methods", False),
        ("fedlightning.callbacks.declared", True),
        ("fedlightning.run", False),  # inside a function
    }
    assert layer_of("fedlightning.methods.fedavg") > layer_of("fedlightning.federated.module")
    assert layer_of("fedlightning.cli") == len(LAYERS) - 1
