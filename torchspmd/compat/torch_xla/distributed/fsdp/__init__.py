"""``torch_xla.distributed.fsdp``: the FSDPv2 wrapper and ``checkpoint_module``; FSDPv1 has
no meaning under SPMD."""

from torchspmd.compat.errors import refusing
from torchspmd.parallel import SpmdFullyShardedDataParallel  # noqa: F401

from . import utils, wrap  # noqa: F401
from .utils import checkpoint_module  # noqa: F401

XlaFullyShardedDataParallel = refusing(
    "torch_xla.distributed.fsdp.XlaFullyShardedDataParallel",
    "use SpmdFullyShardedDataParallel (FSDPv2), which shards over a Mesh axis 'fsdp'")
