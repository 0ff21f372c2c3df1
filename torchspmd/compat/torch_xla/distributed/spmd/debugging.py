"""``torch_xla.distributed.spmd.debugging``: pictures of a layout, and its V1 text."""

from __future__ import annotations

import torch

from torchspmd.debug import visualize_sharding, visualize_tensor_sharding  # noqa: F401
from torchspmd.sharding import get_sharding, unwrap_sharded_tensor


def construct_v1_sharding_str(t: torch.Tensor) -> str:
    """``t``'s sharding in HLO's V1 text (``'{devices=[2,1]0,1}'``, device ids listed),
    ``''`` if it has none: ``get_sharding``, which already writes V1.

    Example: ``construct_v1_sharding_str(x) == xs.get_sharding(x)``.
    """
    return get_sharding(unwrap_sharded_tensor(t))
