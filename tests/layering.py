"""The layering check: torchspmd's imports against the layer table of docs/concepts/layers.md.

Every module is parsed with ``ast`` (nothing is imported, so the check is fast and sees
imports deferred into functions as well as module-level ones; imports under
``if TYPE_CHECKING:`` do not count). Three rules:

- no import points up the table (:func:`upward_imports`);
- no circle among the modules of one layer (:func:`circles`);
- no underscored name crosses a package (:func:`private_reaches`).

Example::

    layers = read_layers(Path("docs/concepts/layers.md").read_text())
    tree = Tree.read(Path("torchspmd"))
    assert upward_imports(tree, layers) == []
"""

from __future__ import annotations

import ast
import functools
import graphlib
import re
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "torchspmd"


@dataclass(frozen=True)
class Module:
    """One module's dotted name and source; ``is_package`` for an ``__init__.py``."""

    name: str
    source: str
    is_package: bool = False


@dataclass(frozen=True)
class Import:
    """One import: ``importer`` imports module ``target``, or ``name`` from it.

    ``attribute`` is an underscored attribute read on the imported module
    (``module._y``), else None.
    """

    importer: str
    target: str
    name: str | None
    line: int
    attribute: str | None = None

    def __str__(self) -> str:
        what = self.target + "".join(f".{x}" for x in (self.name, self.attribute) if x)
        return f"{self.importer}:{self.line} imports {what}"


@dataclass(frozen=True)
class Tree:
    """The modules of one package, by dotted name."""

    modules: dict[str, Module]

    @classmethod
    def read(cls, root: Path, package: str = PACKAGE) -> Tree:
        """Every module of the package whose directory is ``root``."""
        modules = {}
        for path in sorted(root.rglob("*.py")):
            parts = [package, *path.relative_to(root).with_suffix("").parts]
            is_package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_package else parts)
            modules[name] = Module(name, path.read_text(), is_package)
        return cls(modules)

    def unit_of(self, name: str) -> str:
        """The table's unit holding module ``name``: its package, or its own file.

        >>> tree = Tree({m.name: m for m in [Module("p", "", True), Module("p.a", "", True),
        ...              Module("p.a.x", ""), Module("p.b", "")]})
        >>> tree.unit_of("p.a.x"), tree.unit_of("p.b"), tree.unit_of("p")
        ('a/', 'b.py', '__init__.py')
        """
        parts = name.split(".")
        if len(parts) == 1:
            return "__init__.py"
        top = self.modules.get(".".join(parts[:2]))
        return f"{parts[1]}/" if top is None or top.is_package else f"{parts[1]}.py"

    @functools.cached_property
    def syntax(self) -> dict[str, ast.Module]:
        """Each module's syntax tree, parsed once."""
        return {name: ast.parse(m.source) for name, m in self.modules.items()}

    @functools.cached_property
    def imports(self) -> list[Import]:
        """Every import of a module of the tree by a module of the tree."""
        return [i for m in self.modules.values() for i in _imports_in(self, m)]

    @functools.cached_property
    def exported(self) -> dict[str, frozenset[str]]:
        """Each module's literal ``__all__`` (empty if it has none)."""
        return {name: _exported(syntax) for name, syntax in self.syntax.items()}


def read_layers(markdown: str) -> list[frozenset[str]]:
    """The layers of the page's first table, top first: each a set of units.

    A unit is a package (``sharding/``) or a top-level module (``jax_setup.py``), written
    in backticks in the table's first column.

    >>> read_layers("| layer | owns |\\n| --- | --- |\\n| `a/`, `b.py` | x |\\n| `c/` | y |")
    [frozenset({'a/', 'b.py'}), frozenset({'c/'})]
    """
    rows = [line for line in markdown.splitlines() if line.startswith("|")]
    if len(rows) < 3:
        raise ValueError("no layer table found (a markdown table with a header row)")
    layers = []
    for row in rows[2:]:  # after the header and its --- line
        units = frozenset(re.findall(r"`([^`]+)`", row.strip("|").split("|")[0]))
        if not units:
            raise ValueError(f"a layer row names no package in backticks: {row!r}")
        layers.append(units)
    return layers


def depth_of(tree: Tree, layers: list[frozenset[str]]) -> dict[str, int]:
    """Each module's layer, 0 at the top; a module in no layer raises ``ValueError``."""
    index = {unit: i for i, units in enumerate(layers) for unit in units}
    depth = {}
    for name in tree.modules:
        unit = tree.unit_of(name)
        if unit not in index:
            raise ValueError(f"{name} is in `{unit}`, which no row of the layer table names: "
                             "add it to docs/concepts/layers.md at the layer it belongs to")
        depth[name] = index[unit]
    return depth


def upward_imports(tree: Tree, layers: list[frozenset[str]]) -> list[Import]:
    """The imports that point up the table."""
    depth = depth_of(tree, layers)
    return [i for i in tree.imports if depth[i.target] < depth[i.importer]]


def circles(tree: Tree, layers: list[frozenset[str]]) -> list[list[str]]:
    """One import circle per layer that has any (``graphlib`` names one per graph)."""
    depth = depth_of(tree, layers)
    found = []
    for layer in range(len(layers)):
        graph: dict[str, set[str]] = {}
        for i in tree.imports:
            if depth[i.importer] == depth[i.target] == layer and i.importer != i.target:
                graph.setdefault(i.importer, set()).add(i.target)
        try:
            graphlib.TopologicalSorter(graph).prepare()
        except graphlib.CycleError as error:
            found.append(error.args[1])
    return found


def private_reaches(tree: Tree) -> list[Import]:
    """Underscored names (or private modules) imported from another package.

    A name the target module lists in ``__all__`` is public whatever its spelling
    (PyTorch/XLA's API has ``_mark_manual_sharding``).
    """
    return [i for i in tree.imports
            if tree.unit_of(i.importer) != tree.unit_of(i.target) and _is_private(tree, i)]


def _is_private(tree: Tree, i: Import) -> bool:
    name = i.name or i.attribute
    if name is not None and name in tree.exported[i.target]:
        name = None
    path = i.target.split(".")[1:] + ([name] if name else [])
    return any(p.startswith("_") and not p.startswith("__") for p in path)


def _exported(syntax: ast.Module) -> frozenset[str]:
    """The names a module's literal ``__all__`` lists (none if it has no such list)."""
    for node in syntax.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and getattr(node.targets[0], "id", None) == "__all__"):
            try:
                return frozenset(ast.literal_eval(node.value))
            except ValueError:  # built, not literal: nothing counts as listed
                return frozenset()
    return frozenset()


def _counted_nodes(syntax: ast.Module):
    """Every node of ``syntax`` except those under ``if TYPE_CHECKING:`` (its body; its
    ``else`` counts), in one pass."""
    stack: list[ast.AST] = [syntax]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
        else:
            stack.extend(ast.iter_child_nodes(node))


def _is_type_checking(test: ast.expr) -> bool:
    return (getattr(test, "id", None) == "TYPE_CHECKING"
            or getattr(test, "attr", None) == "TYPE_CHECKING")


def _imports_in(tree: Tree, module: Module) -> list[Import]:
    found: list[Import] = []
    bound: dict[str, str] = {}  # local name -> the tree's module it is bound to
    attributes: list[ast.Attribute] = []
    for node in _counted_nodes(tree.syntax[module.name]):
        if isinstance(node, ast.Attribute):
            if node.attr.startswith("_") and not node.attr.startswith("__"):
                attributes.append(node)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in tree.modules:
                    found.append(Import(module.name, alias.name, None, node.lineno))
                    first = alias.name.split(".")[0]  # ``import a.b`` binds ``a``
                    bound[alias.asname or first] = alias.name if alias.asname else first
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, node)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in tree.modules:  # ``from torchspmd.runtime import launch``
                    found.append(Import(module.name, sub, None, node.lineno))
                    bound[alias.asname or alias.name] = sub
                elif base in tree.modules:
                    found.append(Import(module.name, base, alias.name, node.lineno))
    for node in attributes:  # ``module._y`` on a module bound above
        target = _module_named(tree, bound, node.value)
        if target is not None:
            found.append(Import(module.name, target, None, node.lineno, node.attr))
    return found


def _module_named(tree: Tree, bound: dict[str, str], node: ast.expr) -> str | None:
    """The tree's module that ``node`` (``name`` or ``name.sub.sub``) denotes, if any."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in bound:
        return None
    name = ".".join([bound[node.id], *reversed(attrs)])
    return name if name in tree.modules else None


def _absolute(module: Module, node: ast.ImportFrom) -> str:
    """The absolute module name an ``ImportFrom`` reads from (relative ones resolved)."""
    if not node.level:
        return node.module or ""
    parts = module.name.split(".")
    if not module.is_package:
        parts = parts[:-1]
    parts = parts[:len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))
