"""Generation: Hugging Face ``generate`` compiled a fixed number of times, sharded or not.

Modules, one idea each: ``buckets`` (the sizes prompts and caches are padded to),
``recompiles`` (counting and warning about loops that recompile), ``hf`` (the Hugging Face
adaptation; the only module here that imports ``transformers``, on first use).

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


__all__ = ["compile_generate", "Buckets", "DEFAULT_PROMPT_LENGTHS", "DEFAULT_CACHE_MULTIPLE",
           "RecompileWarning", "RecompileWatch"]
