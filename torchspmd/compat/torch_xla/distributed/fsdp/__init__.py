"""``torch_xla.distributed.fsdp``: the FSDPv2 wrapper; FSDPv1 has no meaning under SPMD."""

from torchspmd.compat.errors import refusing
from torchspmd.parallel import SpmdFullyShardedDataParallel  # noqa: F401

from . import wrap  # noqa: F401

XlaFullyShardedDataParallel = refusing(
    "torch_xla.distributed.fsdp.XlaFullyShardedDataParallel",
    "use SpmdFullyShardedDataParallel (FSDPv2), which shards over a Mesh axis 'fsdp'")
