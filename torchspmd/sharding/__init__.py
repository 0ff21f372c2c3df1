"""The sharding API of ``torch_xla.distributed.spmd``, on JAX.

Example::

    import numpy as np, torch, torchspmd as xs
    mesh = xs.Mesh(np.arange(8), (2, 4), ("data", "model"))
    x = torch.randn(16, 128).to("spmd")
    xs.mark_sharding(x, mesh, ("data", None))
"""

from torchspmd.sharding.api import (MarkShardingFunction, ShardingSpec,
                                    annotate_custom_sharding, clear_sharding, get_sharding,
                                    mark_sharding, mark_sharding_with_gradients, shard_as,
                                    unwrap_sharded_tensor, wrap_as_sharded_tensor,
                                    wrap_if_sharded)
from torchspmd.sharding.hlo_text import ShardingType
from torchspmd.sharding.manual import (_mark_manual_sharding, disable_manual_sharding,
                                       enable_manual_sharding)
from torchspmd.sharding.mesh import (HybridMesh, InvalidShardingError, Mesh, get_1d_mesh,
                                     get_global_mesh, set_global_mesh)
from torchspmd.sharding.sharded_tensor import XLAShard, XLAShardedTensor

__all__ = [
    "Mesh",
    "HybridMesh",
    "get_1d_mesh",
    "set_global_mesh",
    "get_global_mesh",
    "InvalidShardingError",
    "ShardingType",
    "ShardingSpec",
    "XLAShard",
    "XLAShardedTensor",
    "mark_sharding",
    "mark_sharding_with_gradients",
    "MarkShardingFunction",
    "clear_sharding",
    "annotate_custom_sharding",
    "get_sharding",
    "shard_as",
    "wrap_if_sharded",
    "wrap_as_sharded_tensor",
    "unwrap_sharded_tensor",
    "enable_manual_sharding",
    "disable_manual_sharding",
    "_mark_manual_sharding",
]
