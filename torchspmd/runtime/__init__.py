"""The runtime: graphs, compile cache, execution, transfers, processes.

PyTorch/XLA's ``torch_xla.runtime`` queries live here under the same names, with the
values PyTorch/XLA gives under SPMD (one virtual device per process)::

    import torchspmd.runtime as xr
    if xr.process_index() == 0:
        print(f"{xr.process_count()} processes, {xr.global_runtime_device_count()} devices")

This package imports only what the queries need: ``torchspmd.jax_setup`` imports it
before JAX is configured.
"""

from torchspmd.runtime.processes import (addressable_runtime_device_count,
                                         global_ordinal, global_runtime_device_count,
                                         is_master_ordinal, local_device_count,
                                         local_ordinal, local_process_count, process_count,
                                         process_index, world_size)

__all__ = [
    "process_index",
    "process_count",
    "local_process_count",
    "global_runtime_device_count",
    "addressable_runtime_device_count",
    "local_device_count",
    "world_size",
    "global_ordinal",
    "local_ordinal",
    "is_master_ordinal",
]
