"""A Hugging Face static cache as the compiled decode steps see it: whether a cache is
one, its length, and its tensors as a step's argument. Shared by ``hf`` (the adaptation
of ``generate``) and ``greedy`` (its loop on the device).

Example::

    if is_static(cache):
        step(tensors(cache), ...)        # the cache's keys, values and lengths
        length(cache)                    # the positions it holds
"""

from __future__ import annotations

import torch
from transformers import StaticCache
from transformers.cache_utils import Cache


_FIELDS = ("keys", "values", "cumulative_length")  # per layer, in ``tensors``' order


def is_static(cache) -> bool:
    """Whether ``cache`` is a static cache whose state is all in tensors (fixed shapes:
    one decode program). A sliding-window layer (Mistral's ``sliding_window``, the
    sliding layers of Gemma 2 and 3) counts its positions in a Python int and picks its
    update by it: a replay would not advance it, and a prompt padded to a bucket would
    push the prompt out of its window. Such caches run as dynamic ones do, lazily."""
    return isinstance(cache, StaticCache) and not has_sliding_layers(cache)


def has_sliding_layers(cache) -> bool:
    """Whether ``cache`` has a sliding-window layer (see :func:`is_static`)."""
    return any(getattr(layer, "is_sliding", False) for layer in getattr(cache, "layers", ()))


def length(cache: Cache) -> int:
    """How many positions the cache holds."""
    return cache.get_mask_sizes(1, 0)[0]


def tensors(cache: Cache) -> list[torch.Tensor]:
    """The cache's tensors, as a compiled decode step's argument: they are arguments, not
    state found by the capture, because each generate call makes a new cache, and a
    replay must read and write the current one."""
    return [getattr(layer, field) for layer in cache.layers for field in _FIELDS]


def swap(cache: Cache, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Put ``tensors`` (in :func:`tensors`' order) in the cache's layers; the ones they
    replace. The device loop traces a token on stand-ins for the cache's tensors."""
    old = []
    values = iter(tensors)
    for layer in cache.layers:
        for field in _FIELDS:
            old.append(getattr(layer, field))
            setattr(layer, field, next(values))
    return old
