"""Parallelism built on sharding annotations: FSDPv2 and module distribution.

Example::

    from torchspmd.parallel import SpmdFullyShardedDataParallel as FSDPv2
    mesh = Mesh(np.arange(8), (8,), ("fsdp",))
    model = FSDPv2(MyModel(), mesh=mesh)          # every weight sharded over 'fsdp'
"""

from torchspmd.parallel.distribute import auto_policy, xla_distribute_module
from torchspmd.parallel.fsdp import (SpmdFullyShardedDataParallel,
                                     apply_backward_optimization_barrier, fsdp_partition_spec)
from torchspmd.parallel.linear import (EinsumLinear, XLAPatchedLinear,
                                       apply_xla_patch_to_nn_linear, xla_patched_nn_linear_forward)

__all__ = [
    "EinsumLinear",
    "XLAPatchedLinear",
    "apply_xla_patch_to_nn_linear",
    "xla_patched_nn_linear_forward",
    "SpmdFullyShardedDataParallel",
    "apply_backward_optimization_barrier",
    "auto_policy",
    "fsdp_partition_spec",
    "xla_distribute_module",
]
