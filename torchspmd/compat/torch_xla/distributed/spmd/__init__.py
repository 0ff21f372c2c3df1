"""``torch_xla.distributed.spmd`` (``xs``): torchspmd's sharding API under PyTorch/XLA's names.

Example::

    import torch_xla.distributed.spmd as xs
    mesh = xs.Mesh(np.arange(8), (4, 2), ("data", "model"))
    xs.mark_sharding(x, mesh, ("data", None))
"""

from torchspmd.parallel import (SpmdFullyShardedDataParallel,  # noqa: F401
                                apply_backward_optimization_barrier, auto_policy,
                                convert_to_xla_mesh, xla_distribute_module,
                                xla_distribute_tensor)
from torchspmd.sharding import *  # noqa: F401,F403
from torchspmd.sharding import _mark_manual_sharding  # noqa: F401
from torchspmd import XLAPatchedLinear, apply_xla_patch_to_nn_linear  # noqa: F401
from torchspmd import xla_patched_nn_linear_forward  # noqa: F401

from . import debugging  # noqa: F401,E402
