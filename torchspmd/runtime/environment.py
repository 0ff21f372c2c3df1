"""torchspmd's settings read from environment variables, checked where they are read.

A value that cannot be used raises a ``ValueError`` naming the variable, what it sets and
an example, instead of Python's ``invalid literal for int()`` or a failure further on.

>>> positive_int("TORCHSPMD_CPU_DEVICES", "the number of CPU devices", 8, {"TORCHSPMD_CPU_DEVICES": "4"})
4
>>> positive_int("TORCHSPMD_CPU_DEVICES", "the number of CPU devices", 8, {}) is None
True
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["positive_int"]


def positive_int(name: str, meaning: str, example: int,
                 environ: Mapping[str, str] | None = None) -> int | None:
    """Variable ``name`` as an int >= 1, or None when it is unset or empty."""
    text = (os.environ if environ is None else environ).get(name, "")
    if not text.strip():
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"torchspmd: {name}={text!r} must be an int >= 1 ({meaning}), e.g. "
                         f"{name}={example}.")
    return value
