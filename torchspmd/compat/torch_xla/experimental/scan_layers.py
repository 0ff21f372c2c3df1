"""``torch_xla.experimental.scan_layers``: ``torchspmd.scan_layers``."""

from __future__ import annotations

from collections.abc import Iterable

import torch

import torchspmd
from torchspmd.compat.errors import unsupported


def scan_layers(layers: Iterable[torch.nn.Module], input_data: torch.Tensor,
                partition_fn=None, is_layer_pure: bool = False) -> torch.Tensor:
    """``torchspmd.scan_layers(layers, input_data)`` (one ``lax.scan``; each layer's forward
    is recomputed in the backward). ``is_layer_pure`` is a caching hint PyTorch/XLA needs;
    torchspmd traces the layer once per call whatever it says."""
    if partition_fn is not None:
        unsupported("scan_layers(partition_fn=...)", "torchspmd.scan_layers(checkpoint=False) "
                    "saves every residual; checkpoint=True (default) recomputes the forward")
    return torchspmd.scan_layers(layers, input_data)
