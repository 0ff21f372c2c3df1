"""Every Python example of the README and docs/ runs (docs that cannot rot)."""

from __future__ import annotations

import os
import traceback

import pytest

import torchspmd.compat

from tests.distributed.launcher import torchrun
from tests.docs.markdown import PAGES, REPO, examples

_IN_PROCESS = [page for page in PAGES if any(not e.fragment and not e.torchrun
                                              for e in examples(page))]
_TORCHRUN = [e for page in PAGES for e in examples(page) if e.torchrun]


def test_fragments_are_few():
    """Examples shown but never run are marked as such, and stay rare."""
    fragments = [e.where for page in PAGES for e in examples(page) if e.fragment]
    assert len(fragments) <= 3, fragments


@pytest.mark.parametrize("page", _IN_PROCESS, ids=lambda p: str(p.relative_to(REPO)))
def test_page_examples_run(page):
    """The page's examples run in order in one namespace; each asserts what it shows."""
    namespace: dict = {"__name__": "__docs__"}
    compat_before = torchspmd.compat.is_installed()
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        for example in examples(page):
            if example.fragment or example.torchrun:
                continue
            try:
                exec(compile(example.code, example.where, "exec"), namespace)
            except Exception:
                pytest.fail(f"example at {example.where} failed:\n{traceback.format_exc()}")
    finally:
        os.chdir(cwd)
        if not compat_before:  # an example ran torchspmd.compat.install()
            torchspmd.compat.uninstall()


@pytest.mark.parametrize("example", _TORCHRUN, ids=lambda e: e.where)
def test_torchrun_examples_run(example, tmp_path):
    """Examples marked <!-- torchrun=N --> run as N processes under torchrun."""
    script = tmp_path / "example.py"
    script.write_text(example.code)
    finished = torchrun(script, nproc=example.torchrun)
    assert finished.returncode == 0, f"{example.where}:\n{finished.output[-4000:]}"
