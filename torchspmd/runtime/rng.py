"""Device RNG state: a seed and a counter; every random op gets the next derived seed.

The seed reaches the compiled graph as an input, so dropout masks change every step
without recompiling, and ``torch.manual_seed(s)`` makes a run reproducible.
"""

from __future__ import annotations

# The design's RNG registry.
_STATE = {"seed": 0, "counter": 0}

_MASK = (1 << 63) - 1


def manual_seed(seed: int) -> None:
    """Restart the device random stream from ``seed``. Example: ``torchspmd.manual_seed(0)``."""
    _STATE["seed"] = int(seed) & _MASK
    _STATE["counter"] = 0


def initial_seed() -> int:
    """The seed set by the last :func:`manual_seed`."""
    return _STATE["seed"]


def next_seed() -> int:
    """A fresh 63-bit seed for one random op (splitmix64 of seed and counter)."""
    _STATE["counter"] += 1
    z = (_STATE["seed"] + _STATE["counter"] * 0x9E3779B97F4A7C15) & ((1 << 64) - 1)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
    return (z ^ (z >> 31)) & _MASK


def get_state() -> tuple[int, int]:
    """(seed, counter), to save and restore the stream."""
    return _STATE["seed"], _STATE["counter"]


def set_state(state: tuple[int, int]) -> None:
    _STATE["seed"], _STATE["counter"] = state
