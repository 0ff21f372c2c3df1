"""A weak set for the live-handle registry, cheaper on the recording path than ``WeakSet``.

Every op of a step makes a pending storage and adds it to the registry. ``weakref.WeakSet``
adds through Python code and runs a Python callback when a member dies, which together
cost about as much as recording the op's node. Here a member is a plain weak reference
(no callback) keyed by ``id``: dead members are skipped when the registry is read and
dropped when it is cleared (every ``sync()``), or pruned when they pile up.
"""

from __future__ import annotations

import weakref
from typing import Iterable, Iterator


class WeakRegistry:
    """A set of objects held weakly: ``add``, ``discard``, ``update``, ``clear``, iteration.

    Example::

        pending = WeakRegistry()
        pending.add(storage)
        list(pending)   # [storage] while it lives, [] once it is gone
    """

    __slots__ = ("_refs", "_limit", "generation")

    _MIN_LIMIT = 4096

    def __init__(self):
        self._refs: dict[int, weakref.ref] = {}
        self._limit = self._MIN_LIMIT
        # Grows whenever the registry is emptied: a member that noted the generation it
        # was added in is still a member while that is the current one (``Storage.set``
        # skips adding again what it added since the last ``sync()``).
        self.generation = 0

    def add(self, obj) -> None:
        refs = self._refs
        # A dead member's id may be reused: the newer object replaces its entry.
        refs[id(obj)] = weakref.ref(obj)
        if len(refs) > self._limit:
            self._prune()

    def discard(self, obj) -> None:
        ref = self._refs.get(id(obj))
        if ref is not None and ref() is obj:
            del self._refs[id(obj)]
            self.generation += 1  # ``obj`` may have noted the current one: it must add again

    def update(self, objs: Iterable) -> None:
        for obj in objs:
            self.add(obj)

    def take(self) -> list:
        """The live members, in the order they were added; the registry is then empty.

        (``list(registry)`` would count the members first, a second walk.)
        """
        live = [obj for obj in [ref() for ref in self._refs.values()] if obj is not None]
        self.clear()
        return live

    def members(self) -> set[int]:
        """The ids of the current entries: a mark for :meth:`drop_new`."""
        return set(self._refs)

    def drop_new(self, mark: set[int]) -> None:
        """Forget every member added since ``mark`` (:meth:`members`) was taken.

        Example::

            mark = registry.members()
            registry.add(scratch)
            registry.drop_new(mark)     # scratch is no longer a member
        """
        new = [key for key in self._refs if key not in mark]
        for key in new:
            del self._refs[key]
        if new:
            self.generation += 1  # they may have noted the current one: they must add again

    def clear(self) -> None:
        self._refs.clear()
        self._limit = self._MIN_LIMIT
        self.generation += 1

    def __iter__(self) -> Iterator:
        for ref in list(self._refs.values()):
            obj = ref()
            if obj is not None:
                yield obj

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def _prune(self) -> None:
        """Drop dead members; the next prune waits until the registry doubles."""
        self._refs = {key: ref for key, ref in self._refs.items() if ref() is not None}
        self._limit = max(self._MIN_LIMIT, 2 * len(self._refs))
