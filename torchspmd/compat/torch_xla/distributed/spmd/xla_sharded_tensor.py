"""``torch_xla.distributed.spmd.xla_sharded_tensor``: ``XLAShardedTensor`` and its shard type.

Example: ``from torch_xla.distributed.spmd.xla_sharded_tensor import XLAShardedTensor``.
"""

from torchspmd.sharding.sharded_tensor import *  # noqa: F401,F403
