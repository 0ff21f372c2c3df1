"""``torch_xla.distributed``."""

from . import fsdp, parallel_loader, spmd, xla_multiprocessing  # noqa: F401
