"""Callbacks the runtime calls after a ``sync()`` or a host read has run its programs.

The layers above the runtime register here what must look at results once they exist
(``device/index_checks.py``: the in-graph index-range flags), without the runtime
importing them. ``blocking`` says whether the caller waits for the devices anyway (a host
read does; a plain ``sync()`` does not, and a hook must then not wait).

Example::

    AFTER_RUN.append(lambda blocking: ...)   # once, at import of the registering module
"""

from __future__ import annotations

from typing import Callable

__all__ = ["AFTER_RUN", "after_run"]

AFTER_RUN: list[Callable[[bool], None]] = []  # registry: called in order after each run


def after_run(blocking: bool) -> None:
    """Call every registered hook (an exception from one propagates to the caller)."""
    for hook in AFTER_RUN:
        hook(blocking)
