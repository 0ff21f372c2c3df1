"""``torch_xla.experimental.xla_sharding``: the old name of ``torch_xla.distributed.spmd``."""

from ..distributed.spmd import *  # noqa: F401,F403
from ..distributed.spmd import _mark_manual_sharding  # noqa: F401
