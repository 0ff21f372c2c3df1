"""Buckets: the few fixed sizes that generation pads prompts and caches to.

A compiled program has fixed shapes, so a prompt of every new length would be a new
prefill program and a cache of every new length a new decode program. Prompts are padded
on the right to the smallest bucket that holds them (the padding sits after the prompt,
where the causal mask hides it and the first generated tokens overwrite it), and static
caches are rounded up to a multiple of ``cache_multiple``. Nothing here knows a model.

Example::

    b = Buckets(prompt_lengths=(16, 64), cache_multiple=64)
    b.prompt(5), b.prompt(17), b.prompt(70)   # 16, 64, 128 (multiples of the largest)
    b.cache(263)                              # 320
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PROMPT_LENGTHS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
DEFAULT_CACHE_MULTIPLE = 64


@dataclass(frozen=True)
class Buckets:
    """Prompt-length buckets and the cache-length rounding of one model's generation.

    ``prompt_lengths``: increasing lengths a prompt is padded up to; a prompt longer than
    the largest is padded to a multiple of the largest. ``cache_multiple``: a static
    cache's length is rounded up to a multiple of it.
    """

    prompt_lengths: tuple[int, ...] = DEFAULT_PROMPT_LENGTHS
    cache_multiple: int = DEFAULT_CACHE_MULTIPLE

    def __post_init__(self):
        lengths = tuple(self.prompt_lengths)
        if not lengths or any(isinstance(n, bool) or not isinstance(n, int) or n < 1
                              for n in lengths) or list(lengths) != sorted(set(lengths)):
            raise ValueError("torchspmd.generation: prompt_lengths must be a non-empty, strictly "
                             f"increasing list of positive ints, got {self.prompt_lengths!r}")
        if isinstance(self.cache_multiple, bool) or not isinstance(self.cache_multiple, int) \
                or self.cache_multiple < 1:
            raise ValueError("torchspmd.generation: cache_multiple must be a positive int, got "
                             f"{self.cache_multiple!r}")
        object.__setattr__(self, "prompt_lengths", lengths)

    def prompt(self, length: int) -> int:
        """The padded length of a prompt of ``length`` tokens."""
        for bucket in self.prompt_lengths:
            if length <= bucket:
                return bucket
        return _round_up(length, self.prompt_lengths[-1])

    def cache(self, length: int) -> int:
        """The length of a static cache that must hold ``length`` tokens."""
        return _round_up(length, self.cache_multiple)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple
