"""Parallelism built on sharding annotations: FSDPv2 and module distribution.

Example::

    from torchspmd.parallel import SpmdFullyShardedDataParallel as FSDPv2
    mesh = Mesh(np.arange(8), (8,), ("fsdp",))
    model = FSDPv2(MyModel(), mesh=mesh)          # every weight sharded over 'fsdp'
"""

from torchspmd.parallel.distribute import auto_policy, xla_distribute_module
from torchspmd.parallel.fsdp import (SpmdFullyShardedDataParallel,
                                     apply_backward_optimization_barrier, fsdp_partition_spec)
from torchspmd.parallel.scan import scan_layers

__all__ = [
    "SpmdFullyShardedDataParallel",
    "apply_backward_optimization_barrier",
    "auto_policy",
    "fsdp_partition_spec",
    "scan_layers",
    "xla_distribute_module",
]
