"""Recompile watch: a decoding loop whose inputs change shape says so, never silently.

Each model call of a generation loop is described by the shapes of its inputs (a name ->
shape dict). When a call compiled a program although an earlier call had run, the watch
counts a recompile in ``torchspmd.metrics()`` under ``generate_recompiles`` and, per input
whose shape changed, under ``generate_recompiles_<input>``; after ``warn_after``
recompiles it warns once, naming the remedy.

Example::

    watch = RecompileWatch(warn_after=3, remedy='pass cache_implementation="static"')
    watch.observe({"cache": (1, 9), "input_ids": (1, 1)}, compiled=1)
    torchspmd.metrics()["generate_recompiles_cache"]
"""

from __future__ import annotations

import warnings

from torchspmd.runtime.metrics import COUNTERS


class RecompileWarning(UserWarning):
    """A generation loop compiles a new program for many of its tokens."""


class RecompileWatch:
    """Counts the calls of one loop that compiled again, and why (see the module docstring)."""

    def __init__(self, warn_after: int, remedy: str):
        self.warn_after = warn_after
        self.remedy = remedy
        self.recompiles = 0
        self._last: dict[str, tuple] | None = None
        self._warned = False

    def start(self) -> None:
        """A new loop begins (its first call compiles by right)."""
        self._last = None

    def observe(self, shapes: dict[str, tuple], compiled: int) -> None:
        """Note one call's input shapes and how many programs it compiled."""
        last, self._last = self._last, shapes
        if not compiled or last is None:
            return
        changed = [name for name in shapes if last.get(name) != shapes[name]]
        changed += [name for name in last if name not in shapes]
        self.recompiles += 1
        COUNTERS["generate_recompiles"] += 1
        for name in changed or ["unknown"]:
            key = f"generate_recompiles_{name}"
            COUNTERS[key] = COUNTERS.get(key, 0) + 1
        if self.recompiles >= self.warn_after and not self._warned:
            self._warned = True
            what = ", ".join(f"{n} {last.get(n)} -> {shapes.get(n)}" for n in changed) or \
                "no input shape changed"
            warnings.warn(
                f"torchspmd.generation: {self.recompiles} calls of this generation loop compiled "
                f"a new program (the inputs changed shape: {what}); every token will. "
                f"{self.remedy}.", RecompileWarning, stacklevel=4)
