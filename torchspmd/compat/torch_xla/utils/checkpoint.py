"""``torch_xla.utils.checkpoint``: PyTorch/XLA's copy of activation checkpointing, served by
PyTorch's own (``torch.utils.checkpoint.checkpoint``), which works on the spmd device.

PyTorch/XLA's defaults to ``use_reentrant=True`` and refuses ``False``; here both work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.utils.checkpoint


def checkpoint(function: Callable, *args: Any, use_reentrant: bool = True, **kwargs: Any) -> Any:
    """``function(*args)``, its activations recomputed in the backward pass.

    ``preserve_rng_state`` (default True) is the only other keyword, as in PyTorch/XLA.

    Example::

        >>> x = checkpoint(layer, x)
    """
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs:
        raise ValueError(f"torch_xla.utils.checkpoint.checkpoint: unexpected keyword arguments: "
                         f"{', '.join(kwargs)}")
    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=use_reentrant,
                                             preserve_rng_state=preserve)
