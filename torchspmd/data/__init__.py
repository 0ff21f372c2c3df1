"""Input pipelines for the spmd device: batches uploaded already sharded.

Example::

    from torchspmd.data import ShardedLoader
    from torchspmd.sharding import ShardingSpec
    for x, y in ShardedLoader(loader, "spmd", input_sharding=ShardingSpec(mesh, ("data", None))):
        ...
"""

from torchspmd.data.loader import InputSharding, ShardedLoader, send_cpu_data_to_device

__all__ = ["InputSharding", "ShardedLoader", "send_cpu_data_to_device"]
