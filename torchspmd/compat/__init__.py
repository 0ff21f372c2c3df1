"""Run scripts written for PyTorch/XLA's SPMD API unchanged.

The topmost layer: it maps PyTorch/XLA's module names (``torch_xla``,
``torch_xla.core.xla_model``, ``torch_xla.runtime``, ``torch_xla.distributed.spmd``, ...) onto
torchspmd's public API, and the ``'xla'`` device name onto the spmd device. Nothing in
torchspmd imports it. A call that has no meaning here raises ``NotImplementedError`` naming
the call and what to use instead.

From a shell::

    python -m torchspmd.compat train.py --flag value

From Python, before the script's first ``import torch_xla``::

    import torchspmd.compat
    torchspmd.compat.install()
    import torch_xla.distributed.spmd as xs      # torchspmd's sharding API
"""

from __future__ import annotations

from torchspmd.compat.finder import install, is_installed, run_script, uninstall

__all__ = ["install", "uninstall", "is_installed", "run_script"]
