"""``import torch_xla...`` served by ``torchspmd.compat.torch_xla...``: an import hook."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import runpy
import sys
from collections.abc import Sequence

_PREFIX = "torch_xla"
_HOME = "torchspmd.compat."


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``torch_xla.X`` as the already-written module ``torchspmd.compat.torch_xla.X``."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _PREFIX and not fullname.startswith(_PREFIX + "."):
            return None
        try:
            importlib.import_module(_HOME + fullname)
        except ModuleNotFoundError as error:
            if error.name != _HOME + fullname:
                raise
            raise ModuleNotFoundError(
                f"torchspmd.compat: there is no {fullname} here: torchspmd serves PyTorch/XLA's "
                f"SPMD API (torch_xla, .core.xla_model, .runtime, .distributed.spmd, "
                f".distributed.parallel_loader, .distributed.fsdp, .amp, .debug.metrics, "
                f".debug.profiler, .experimental). See docs/migrating.md.", name=fullname) from None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return sys.modules[_HOME + spec.name]

    def exec_module(self, module):
        pass  # already executed under its own name


_FINDER = _Alias()


def is_installed() -> bool:
    """Whether :func:`install` has run. Example: ``install(); assert is_installed()``."""
    return _FINDER in sys.meta_path


def install() -> None:
    """Serve ``import torch_xla...`` and the ``'xla'`` device name from torchspmd (idempotent).

    Raises ``RuntimeError`` if the real ``torch_xla`` is already imported.

    Example::

        >>> import torchspmd.compat; torchspmd.compat.install()
        >>> import torch_xla.core.xla_model as xm
        >>> xm.xla_device()
        device(type='spmd', index=0)
    """
    if is_installed():
        return
    loaded = sys.modules.get(_PREFIX)
    if loaded is not None and not loaded.__name__.startswith(_HOME):
        raise RuntimeError("torchspmd.compat.install(): the real torch_xla is already imported; "
                           "call install() before the first `import torch_xla`.")
    from torchspmd.compat import xla_device

    xla_device.install()
    sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    """Undo :func:`install`: ``import torch_xla`` fails again, ``torch.tensor`` and
    ``Tensor.to`` are PyTorch's own. Tensors already made stay where they are.

    Example: ``install(); ...; uninstall()``.
    """
    if not is_installed():
        return
    from torchspmd.compat import xla_device

    sys.meta_path.remove(_FINDER)
    for name in [n for n in sys.modules if n == _PREFIX or n.startswith(_PREFIX + ".")]:
        del sys.modules[name]
    xla_device.uninstall()


def run_script(script: str, argv: Sequence[str] = ()) -> None:
    """Run ``script`` as ``__main__`` with ``sys.argv = [script, *argv]``, torch_xla served.

    Example: ``run_script("train.py", ["--steps", "10"])``.
    """
    install()
    sys.argv = [script, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
