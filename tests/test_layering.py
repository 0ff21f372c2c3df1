"""torchspmd's imports follow the layer table of docs/concepts/layers.md; the checker
itself is tested on small synthetic packages with planted violations."""

from pathlib import Path

import pytest

from tests.layering import Module, Tree, circles, private_reaches, read_layers, upward_imports

ROOT = Path(__file__).resolve().parents[1]
LAYERS = read_layers((ROOT / "docs" / "concepts" / "layers.md").read_text())



@pytest.fixture(scope="module")
def torchspmd_tree() -> Tree:
    return Tree.read(ROOT / "torchspmd")


def test_no_import_in_torchspmd_points_up_the_layer_table(torchspmd_tree):
    assert [str(i) for i in upward_imports(torchspmd_tree, LAYERS)] == []


def test_no_import_circle_among_the_modules_of_one_layer(torchspmd_tree):
    assert circles(torchspmd_tree, LAYERS) == []


def test_no_underscored_name_is_imported_across_packages(torchspmd_tree):
    assert [str(i) for i in private_reaches(torchspmd_tree)] == []


# The checker on synthetic packages: layers `top/` over `low/`, modules given as source.
SYNTHETIC_LAYERS = read_layers("| layer | owns |\n| --- | --- |\n| `top/`, `__init__.py` | a |\n"
                               "| `low/`, `setup.py` | b |\n")


def tree(**sources: str) -> Tree:
    """A package ``p`` with subpackages ``top`` and ``low``; keys name modules
    (``low__x`` is ``p.low.x``, ``setup`` is the file ``p/setup.py``)."""
    modules = [Module("p", "", True), Module("p.top", "", True), Module("p.low", "", True)]
    modules += [Module("p." + name.replace("__", "."), source) for name, source in sources.items()]
    return Tree({m.name: m for m in modules})


def test_checker_finds_an_upward_import_deferred_into_a_function():
    found = upward_imports(tree(top__a="", low__x="def f():\n    from p.top import a\n"),
                           SYNTHETIC_LAYERS)
    assert [(i.importer, i.target, i.line) for i in found] == [("p.low.x", "p.top.a", 2)]


def test_checker_resolves_relative_imports_and_allows_downward_ones():
    t = tree(top__a="from ..low import x\nfrom ..low.x import f\n", low__x="from .. import top\n",
             setup="from p.low import x\n")
    assert [(i.importer, i.target) for i in upward_imports(t, SYNTHETIC_LAYERS)] == [
        ("p.low.x", "p.top")]


def test_checker_does_not_count_imports_under_type_checking():
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.top import a\n"
    t = tree(top__a="", low__x=source, low__y="import typing\nif typing.TYPE_CHECKING:\n"
             "    import p.top.a\nelse:\n    import p.top.a\n")
    assert [i.importer for i in upward_imports(t, SYNTHETIC_LAYERS)] == ["p.low.y"]


def test_checker_refuses_a_module_in_no_layer_of_the_table():
    with pytest.raises(ValueError, match="p.other.x is in `other/`, which no row"):
        upward_imports(tree(other__x=""), SYNTHETIC_LAYERS)


def test_checker_finds_a_circle_closed_by_a_deferred_import():
    t = tree(low__x="from p.low import y\n", low__y="def f():\n    import p.low.x\n",
             low__z="import p.low.x\n")
    assert [sorted(set(c)) for c in circles(t, SYNTHETIC_LAYERS)] == [["p.low.x", "p.low.y"]]


def test_checker_finds_no_circle_through_a_type_checking_import():
    t = tree(low__x="from p.low import y\n",
             low__y="from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.low import x\n")
    assert circles(t, SYNTHETIC_LAYERS) == []


def test_checker_takes_an_underscored_name_listed_in_all_as_public():
    t = tree(low__x="__all__ = ['_api']\n_api = _hidden = 1\n",
             top__a="from p.low.x import _api, _hidden\n")
    assert [i.name for i in private_reaches(t)] == ["_hidden"]


def test_checker_finds_underscored_names_and_private_modules_across_packages():
    t = tree(low__x="_y = 1\n", low___private="", low__z="from p.low.x import _y\n",
             top__a="from p.low.x import _y\nfrom p.low import _private\n"
                    "import p.low.x as x\nx._y\nimport p.low.x\np.low.x._y\n"
                    "from p.low.x import __doc__\n")
    found = [(i.line, i.target, i.name, i.attribute) for i in private_reaches(t)]
    assert sorted(found) == [(1, "p.low.x", "_y", None), (2, "p.low._private", None, None),
                             (4, "p.low.x", None, "_y"), (6, "p.low.x", None, "_y")]


def test_layer_table_is_read_top_first_with_several_units_per_row():
    assert SYNTHETIC_LAYERS == [frozenset({"top/", "__init__.py"}), frozenset({"low/", "setup.py"})]
    assert LAYERS[-1] == frozenset({"lowering/"}) and LAYERS[0] == frozenset({"compat/"})
    with pytest.raises(ValueError, match="names no package"):
        read_layers("| a | b |\n| --- | --- |\n| none | x |\n")
