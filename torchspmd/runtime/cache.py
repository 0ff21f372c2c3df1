"""A bounded map from graph keys to what was built for them (compiled programs, graph parts).

Least recently used entries go first once ``capacity`` is reached. The compile cache is
one: a compiled program holds about 1-3 MiB of host memory (its executable and JAX's
trace), so a loop over many distinct shapes would otherwise grow without bound.
``TORCHSPMD_COMPILE_CACHE_SIZE`` sets its capacity (default 256 programs), and so does
``torchspmd.set_compile_cache_size(n)``.

Example::

    cache = LRU(2)
    cache["a"] = 1; cache["b"] = 2; cache.get("a"); cache["c"] = 3   # "b" is evicted
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Hashable

from torchspmd.runtime import environment
from torchspmd.runtime.metrics import COUNTERS

__all__ = ["LRU", "DEFAULT_PROGRAMS", "programs_capacity_from_env"]

DEFAULT_PROGRAMS = 256


class LRU:
    """A dict with a capacity: setting a new key past it drops the least recently used.

    ``evictions`` names the ``metrics()`` counter that counts dropped entries (or None).

    >>> c = LRU(1); c["a"] = 1; c["b"] = 2; "a" in c
    False
    """

    def __init__(self, capacity: int, evictions: str | None = None):
        self._items: OrderedDict = OrderedDict()
        self._evictions = evictions
        self.capacity = capacity

    @property
    def capacity(self) -> int:
        return self._capacity

    @capacity.setter
    def capacity(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"torchspmd: a cache capacity must be an int >= 1, got {value!r}")
        self._capacity = value
        self._evict()

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The entry for ``key`` (now the most recently used), or ``default``."""
        try:
            self._items.move_to_end(key)
        except KeyError:
            return default
        return self._items[key]

    def __setitem__(self, key: Hashable, value: Any) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        self._evict()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        self._items.clear()

    def _evict(self) -> None:
        while len(self._items) > self._capacity:
            self._items.popitem(last=False)
            if self._evictions is not None:
                COUNTERS[self._evictions] += 1


def programs_capacity_from_env() -> int:
    """``TORCHSPMD_COMPILE_CACHE_SIZE`` as an int (default :data:`DEFAULT_PROGRAMS`)."""
    asked = environment.positive_int("TORCHSPMD_COMPILE_CACHE_SIZE",
                                     "the number of compiled programs kept", DEFAULT_PROGRAMS)
    return DEFAULT_PROGRAMS if asked is None else asked
