"""The Python examples, links and headings of the README and docs/ pages, read from markdown.

An example is a fenced block whose info string is ``python``. The line before the fence
may mark it: ``<!-- fragment -->`` (shown, never run: kept few), or
``<!-- torchrun=N -->`` (run alone as a script of N processes under torchrun). The
others run in order, in one namespace per page, as a reader would paste them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from markdown.extensions.toc import slugify

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
_MARK = re.compile(r"<!--\s*(fragment|torchrun=(\d+))\s*-->")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


@dataclass(frozen=True)
class Example:
    page: Path
    line: int  # 1-based line of the opening fence
    code: str
    fragment: bool = False
    torchrun: int = 0  # processes, 0: run in this process

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def examples(page: Path) -> list[Example]:
    """The page's ```python blocks, in order, with their marks."""
    lines = page.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i
            before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            mark = _MARK.search(before)
            i += 1
            body = []
            while lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            found.append(Example(page, start + 1, "\n".join(body) + "\n",
                                 fragment=bool(mark and mark.group(1) == "fragment"),
                                 torchrun=int(mark.group(2)) if mark and mark.group(2) else 0))
        i += 1
    return found


def anchors(page: Path) -> set[str]:
    """The heading ids mkdocs gives the page (its toc slugs)."""
    ids, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            ids.add(slugify(line.lstrip("#").strip().replace("`", ""), "-"))
    return ids


def local_links(page: Path) -> list[str]:
    """Links from ``page`` to files of the repository (no scheme), anchors kept."""
    return [link for link in _LINK.findall(page.read_text())
            if "://" not in link and not link.startswith(("mailto:", "<"))]
