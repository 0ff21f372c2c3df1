"""Parallelism built on sharding annotations: FSDPv2, module distribution, PyTorch TP plans,
scanned layers,
expert parallelism.

Example::

    from torchspmd.parallel import SpmdFullyShardedDataParallel as FSDPv2
    mesh = Mesh(np.arange(8), (8,), ("fsdp",))
    model = FSDPv2(MyModel(), mesh=mesh)          # every weight sharded over 'fsdp'
"""

from torchspmd.parallel.distribute import (auto_policy, xla_distribute_module,
                                           xla_distribute_tensor)
from torchspmd.parallel.experts import (ExpertPlan, ExpertRole, ShardedParameter,
                                        shard_experts)
from torchspmd.parallel.fsdp import (SpmdFullyShardedDataParallel,
                                     apply_backward_optimization_barrier, fsdp_partition_spec)
from torchspmd.parallel.linear import (EinsumLinear, XLAPatchedLinear,
                                       apply_xla_patch_to_nn_linear, xla_patched_nn_linear_forward)
from torchspmd.parallel.placements import (convert_to_xla_mesh, placements_to_spec,
                                           spec_to_placements)
from torchspmd.parallel.plans import parallelize_module
from torchspmd.parallel.scan import scan_layers

__all__ = [
    "EinsumLinear",
    "ExpertPlan",
    "ExpertRole",
    "ShardedParameter",
    "shard_experts",
    "XLAPatchedLinear",
    "apply_xla_patch_to_nn_linear",
    "xla_patched_nn_linear_forward",
    "SpmdFullyShardedDataParallel",
    "apply_backward_optimization_barrier",
    "auto_policy",
    "convert_to_xla_mesh",
    "parallelize_module",
    "placements_to_spec",
    "spec_to_placements",
    "fsdp_partition_spec",
    "scan_layers",
    "xla_distribute_module",
    "xla_distribute_tensor",
]
