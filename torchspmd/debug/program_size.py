"""The size of a compiled program, next to another's: what a step's fixed cost grows with.

On an accelerator a training step is a few milliseconds, so the program's parameters,
outputs, whole-array copies and unfused kernels decide its speed as much as its math.
:func:`compare_programs` reads both optimized HLO modules and puts the counts side by
side, with the collectives the partitioner inserted.

Example::

    step = torchspmd.compile(train)
    step(x, y)
    print(torchspmd.debug.compare_programs(step, jax_train_step, params, opt, xj, yj, lr))
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from torchspmd.debug.hlo import COLLECTIVES, _opcode, collectives

__all__ = ["ProgramSize", "ProgramComparison", "program_size", "compare_programs"]

# A computation's header: `[ENTRY ]%name (args) -> result {` at the start of a line.
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\((.*)\)\s*->\s*(.*)\{\s*$")
_CALLS = re.compile(r"\bcalls=%?([\w.\-]+)")


@dataclasses.dataclass(frozen=True)
class ProgramSize:
    """Counts read from one optimized HLO module.

    ``parameters``/``outputs``: the entry computation's arguments and results (tuple
    elements); ``fusions``: fusion instructions; ``copies``/``dots``: ``copy`` and
    ``dot`` instructions outside fused computations (a copy there moves a whole array; a
    dot there is a kernel of its own); ``instructions``: all instructions outside fused
    computations; ``collectives``: as :func:`torchspmd.debug.collectives`.
    """

    parameters: int
    outputs: int
    fusions: int
    copies: int
    dots: int
    instructions: int
    collectives: dict[str, int]


def program_size(hlo: str) -> ProgramSize:
    """The :class:`ProgramSize` of an optimized HLO text (``compiled.as_text()``).

    Example::

        >>> size = program_size("ENTRY %main (p: f32[4]) -> (f32[4], f32[4]) {\\n"
        ...                     "  %p = f32[4]{0} parameter(0)\\n"
        ...                     "  %c = f32[4]{0} copy(%p)\\n"
        ...                     "  ROOT %t = (f32[4]{0}, f32[4]{0}) tuple(%p, %c)\\n}")
        >>> size.parameters, size.outputs, size.copies
        (1, 2, 1)
    """
    if not isinstance(hlo, str):  # ``step.optimized_hlo()`` is None before the first replay
        raise TypeError(
            f"torchspmd.debug.program_size: expected the optimized HLO text, got "
            f"{type(hlo).__name__}. A compiled step has a program only once a call has run it "
            "(its first call runs lazily): call the step twice, then pass "
            "step.optimized_hlo().")
    computations, entry_result = _computations(hlo)
    fused = {name for lines in computations.values() for line in lines
             if _opcode(line) == "fusion" for name in _CALLS.findall(line)}
    counts = {"parameters": 0, "fusions": 0, "copies": 0, "dots": 0, "instructions": 0}
    for name, lines in computations.items():
        opcodes = [_opcode(line) for line in lines]
        counts["fusions"] += opcodes.count("fusion")
        if name in fused:
            continue
        counts["instructions"] += sum(op is not None for op in opcodes)
        counts["copies"] += opcodes.count("copy")
        counts["dots"] += opcodes.count("dot")
    entry = computations.get(_ENTRY, [])
    counts["parameters"] = sum(_opcode(line) == "parameter" for line in entry)
    return ProgramSize(outputs=_tuple_size(entry_result), collectives=collectives(hlo), **counts)


_ENTRY = "<entry>"


def _computations(hlo: str) -> tuple[dict[str, list[str]], str]:
    computations: dict[str, list[str]] = {}
    current: list[str] | None = None
    entry_result = ""
    for line in hlo.splitlines():
        header = _HEADER.match(line)
        if header is not None and not line.startswith(" "):
            name = _ENTRY if header.group(1) else header.group(2)
            if header.group(1):
                entry_result = header.group(4).strip()
            current = computations.setdefault(name, [])
        elif line.startswith("}"):
            current = None
        elif current is not None:
            current.append(line)
    return computations, entry_result


def _tuple_size(shape: str) -> int:
    """Top-level elements of an HLO result shape (``(f32[2], (s32[], f32[]))`` is 2)."""
    shape = shape.strip()
    if not shape.startswith("("):
        return 1 if shape else 0
    depth, count, inner = 0, 1, shape[1:shape.rindex(")")]
    if not inner.strip():
        return 0
    for ch in inner:
        depth += ch in "([{"
        depth -= ch in ")]}"
        count += ch == "," and depth == 0
    return count


@dataclasses.dataclass(frozen=True)
class ProgramComparison:
    """Two :class:`ProgramSize` s; ``str()`` is a table, the other program's column last."""

    ours: ProgramSize
    theirs: ProgramSize
    names: tuple[str, str] = ("torchspmd", "other")

    def rows(self) -> list[tuple[str, int, int]]:
        """(what, ours, theirs) for every count and collective."""
        rows = [(f.name, getattr(self.ours, f.name), getattr(self.theirs, f.name))
                for f in dataclasses.fields(ProgramSize) if f.name != "collectives"]
        return rows + [(c, self.ours.collectives[c], self.theirs.collectives[c])
                       for c in COLLECTIVES]

    def __str__(self) -> str:
        width = max(len(n) for n in self.names) + 2
        lines = [f"{'':14}{self.names[0]:>{width}}{self.names[1]:>{width}}"]
        for what, ours, theirs in self.rows():
            mark = "" if ours == theirs else f"   {ours - theirs:+d}"
            lines.append(f"{what:14}{ours:>{width}}{theirs:>{width}}{mark}")
        return "\n".join(lines)


def compare_programs(step: Any, other: Any, *args: Any, name: str = "other",
                     **kwargs: Any) -> ProgramComparison:
    """The size and collectives of a compiled step's program next to ``other``'s.

    ``step``: a ``torchspmd.compile`` step that has run at least once (its latest
    program), or an optimized HLO text. ``other``: an HLO text, a ``jax.stages.Compiled``
    or ``Lowered``, a ``jax.jit`` function, or a plain JAX function, which is lowered
    and compiled with ``*args, **kwargs`` (nothing runs).

    Example::

        >>> step(x, y)                                             # doctest: +SKIP
        >>> print(compare_programs(step, jax_step, params, opt, xj, yj, lr, name="JAX"))
                       torchspmd       JAX
        parameters            81        48   +33
        ...
    """
    return ProgramComparison(program_size(_hlo_of_step(step)),
                             program_size(_hlo_of(other, args, kwargs)), ("torchspmd", name))


def _hlo_of_step(step: Any) -> str:
    if isinstance(step, str):
        return step
    reader = getattr(step, "optimized_hlo", None)
    if reader is None:
        raise TypeError(f"torchspmd: compare_programs needs a torchspmd.compile step or an "
                        f"HLO text as its first argument, not {type(step).__name__}")
    text = reader()
    if text is None:
        raise RuntimeError("torchspmd: compare_programs: the step has not run yet; call it "
                           "once first, so that it has a program to compare")
    return text


def _hlo_of(other: Any, args: tuple, kwargs: dict) -> str:
    import jax

    if isinstance(other, str):
        return other
    if isinstance(other, jax.stages.Compiled):
        return other.as_text()
    if isinstance(other, jax.stages.Lowered):
        return other.compile().as_text()
    if not callable(other):
        raise TypeError(f"torchspmd: compare_programs cannot read a program from "
                        f"{type(other).__name__}; pass an HLO text, a jax.stages.Compiled, "
                        "a jax.stages.Lowered or a JAX function and its arguments")
    lower = getattr(other, "lower", None)
    if lower is None:
        lower = jax.jit(other).lower
    return lower(*args, **kwargs).compile().as_text()
