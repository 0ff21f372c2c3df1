"""``torch_xla.distributed.spmd.xla_sharding``: the module behind ``xs``, with its names.

Example: ``from torch_xla.distributed.spmd.xla_sharding import Mesh, mark_sharding``.
"""

from torchspmd.compat.torch_xla.distributed.spmd import *  # noqa: F401,F403
from torchspmd.compat.torch_xla.distributed.spmd import _mark_manual_sharding  # noqa: F401
