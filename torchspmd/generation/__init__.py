"""Generation: Hugging Face ``generate`` compiled a fixed number of times, sharded or not.

Modules, one idea each: ``buckets`` (the sizes prompts and caches are padded to),
``recompiles`` (counting and warning about loops that recompile), ``hf`` (the Hugging Face
adaptation), ``greedy`` (greedy decoding with its loop on the device), ``device_loop``
(a token's step run by a loop on the device), ``static_cache``
(a static cache as the compiled steps see it) and ``hf_tp`` (Hugging Face tensor-parallel
plans); nothing imports the last five before first use, so ``import torchspmd`` never
imports ``transformers``.

Example::

    torchspmd.generation.compile_generate(model)        # once, model on torchspmd.device()
    out = model.generate(ids, max_new_tokens=256, cache_implementation="static")
"""

from __future__ import annotations

from torchspmd.generation.buckets import DEFAULT_CACHE_MULTIPLE, DEFAULT_PROMPT_LENGTHS, Buckets
from torchspmd.generation.recompiles import RecompileWarning, RecompileWatch


def compile_generate(model, prompt_lengths=None, cache_multiple=None):
    """See :func:`torchspmd.generation.hf.compile_generate` (imported here on first use, so
    ``import torchspmd`` never imports ``transformers``).

    Example::

        >>> torchspmd.generation.compile_generate(model, prompt_lengths=(16, 64))
    """
    from torchspmd.generation import hf

    return hf.compile_generate(model, prompt_lengths, cache_multiple)


def parallelize_hf(model, mesh, axis: str = "model"):
    """See :func:`torchspmd.generation.hf_tp.parallelize_hf`: shard a Hugging Face model
    over ``axis`` by its own ``base_model_tp_plan``.

    Example::

        >>> torchspmd.generation.parallelize_hf(model, torchspmd.Mesh(range(8), (8,), ("model",)))
    """
    from torchspmd.generation import hf_tp

    return hf_tp.parallelize_hf(model, mesh, axis)


__all__ = ["parallelize_hf", "compile_generate", "Buckets", "DEFAULT_PROMPT_LENGTHS", "DEFAULT_CACHE_MULTIPLE",
           "RecompileWarning", "RecompileWatch"]
