"""The API reference names every public name, and the README's links lead somewhere.

(Links between docs pages are checked by ``make docs``: mkdocs builds in strict mode with
link and anchor validation, mkdocs.yml.)
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from tests.docs.markdown import REPO, anchors, local_links

_API = REPO / "docs" / "api"
_DIRECTIVE = re.compile(r"^::: ([\w.]+)\n((?:[ \t]+.*\n?)*)", re.M)


def _public_modules() -> list[str]:
    """Every torchspmd package that declares ``__all__``, and the top-level modules that do
    (``torchspmd.distributed``)."""
    names = []
    paths = [*(REPO / "torchspmd").rglob("__init__.py"), *(REPO / "torchspmd").glob("*.py")]
    for path in sorted(set(paths)):
        if re.search(r"^__all__\s*=", path.read_text(), re.M):
            parts = path.relative_to(REPO).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _documented() -> dict[str, set[str]]:
    """``{module: members listed}`` for every ``::: module`` directive of docs/api."""
    found: dict[str, set[str]] = {}
    for page in _API.glob("*.md"):
        for module, options in _DIRECTIVE.findall(page.read_text()):
            members = set(re.findall(r"^\s+- (\w+)\s*$", options, re.M))
            found.setdefault(module, set()).update(members)
    return found


@pytest.mark.parametrize("module", _public_modules())
def test_every_public_name_is_in_the_api_reference(module):
    """Each name of the module's __all__ is rendered by a ``::: module`` directive of
    docs/api (as a listed member) or has a directive of its own."""
    documented = _documented()
    owner = importlib.import_module(module)
    missing = [name for name in owner.__all__
               if not _is_documented(module, name, getattr(owner, name), documented)]
    assert not missing, f"{module}: {missing} are not in docs/api/*.md"


def _is_documented(module: str, name: str, value: object,
                   documented: dict[str, set[str]]) -> bool:
    """Listed under ``module``, given a directive, or the same object documented under the
    package it is re-exported from (``torchspmd.Mesh`` is ``torchspmd.sharding.Mesh``)."""
    if name in documented.get(module, set()) or f"{module}.{name}" in documented:
        return True
    return any(name in members and getattr(importlib.import_module(other), name, None) is value
               for other, members in documented.items())


def _readme_links() -> list[str]:
    return local_links(REPO / "README.md")


@pytest.mark.parametrize("link", _readme_links())
def test_readme_links_exist(link):
    """Every file the README links to exists, and so does the section it names."""
    path, _, anchor = link.partition("#")
    target = (REPO / path) if path else REPO / "README.md"
    assert target.exists(), f"README links to {link}: no file {target.relative_to(REPO)}"
    if anchor:
        assert anchor in anchors(target), (
            f"README links to {link}: {Path(path).name} has no section #{anchor}")
