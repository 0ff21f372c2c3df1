"""The user's line: where a warning raised deep inside torchspmd or PyTorch should point.

Example::

    warnings.warn("...", SomeWarning, stacklevel=user_stacklevel())
"""

from __future__ import annotations

import os
import sys

import torch

__all__ = ["user_stacklevel"]

# torchspmd's package directory and PyTorch's: frames in them are not the user's code.
_LIBRARIES = (os.path.dirname(os.path.dirname(__file__)), os.path.dirname(torch.__file__))


def user_stacklevel() -> int:
    """The ``stacklevel`` for ``warnings.warn`` called by the caller of this function that
    names the innermost frame outside torchspmd and PyTorch (the line that called
    ``sync()``, read a value or called a compiled step)."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_code.co_filename.startswith(_LIBRARIES):
        frame, level = frame.f_back, level + 1
    return level
