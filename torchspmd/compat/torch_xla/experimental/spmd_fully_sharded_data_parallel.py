"""``torch_xla.experimental.spmd_fully_sharded_data_parallel``: FSDPv2."""

from torchspmd.parallel import SpmdFullyShardedDataParallel  # noqa: F401
