"""torchspmd: GSPMD sharding for PyTorch, compiled and run by XLA through JAX.

``import torchspmd as xs`` offers PyTorch/XLA's SPMD API
(``torch_xla.distributed.spmd``) on a ``pip install``-able runtime. Example::

    import numpy as np, torch, torchspmd as xs
    mesh = xs.Mesh(np.arange(8), (4, 2), ("data", "model"))
    x = torch.randn(16, 32).to(xs.device())
    xs.mark_sharding(x, mesh, ("data", None))
    y = (x @ x.T).relu()
    xs.sync()
"""

import torchspmd.jax_setup  # noqa: F401  (must configure JAX before anything uses it)
from torchspmd.device.backend import device, device_count, register
from torchspmd.runtime.execute import set_compile_cache_size, sync
from torchspmd.runtime.in_flight import wait_device_ops
from torchspmd.runtime.metrics import metrics
from torchspmd.runtime.metrics import reset as reset_metrics
from torchspmd.runtime.rng import manual_seed
from torchspmd.sharding import *  # noqa: F403  (the torch_xla.distributed.spmd names)
from torchspmd.sharding import __all__ as _sharding_names
from torchspmd.parallel.linear import (XLAPatchedLinear, apply_xla_patch_to_nn_linear,
                                       xla_patched_nn_linear_forward)

register()

from torchspmd.step import compile  # noqa: E402  (torchspmd.compile)
import torchspmd.debug  # noqa: E402,F401  (torchspmd.debug.metrics_report() etc.)
import torchspmd.distributed  # noqa: E402,F401  (torchspmd.distributed.initialize() etc.)
import torchspmd.generation  # noqa: E402,F401  (compile_generate; transformers on first use)
from torchspmd.interop import call_jax  # noqa: E402
from torchspmd.parallel.scan import scan_layers  # noqa: E402
from torchspmd.auto_shard import AutoShardPlan, auto_shard  # noqa: E402

__all__ = ["device", "device_count", "sync", "wait_device_ops", "metrics", "reset_metrics",
           "manual_seed", "set_compile_cache_size", "compile", "call_jax", "scan_layers",
           "auto_shard", "AutoShardPlan",
           "XLAPatchedLinear", "xla_patched_nn_linear_forward", "apply_xla_patch_to_nn_linear",
           *_sharding_names]

# Subpackages with heavier imports (torch.distributed.checkpoint), loaded on first use:
# ``torchspmd.data.ShardedLoader`` works after a plain ``import torchspmd``.
_ON_FIRST_USE = ("data", "checkpoint")


def __getattr__(name: str):
    if name in _ON_FIRST_USE:
        import importlib

        return importlib.import_module(f"torchspmd.{name}")
    raise AttributeError(f"module 'torchspmd' has no attribute {name!r}")
