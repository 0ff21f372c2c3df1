"""The compiled graph's optimized HLO, and the collectives XLA's partitioner put in it.

Example::

    y = x @ w; torchspmd.sync()
    torchspmd.debug.collectives()
    # {'all-gather': 1, 'all-reduce': 0, 'reduce-scatter': 0, 'all-to-all': 0,
    #  'collective-permute': 0}
"""

from __future__ import annotations

import re

from torchspmd.runtime.execute import last_program

__all__ = ["COLLECTIVES", "last_hlo", "collectives", "copied_arguments"]

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")

# `%name = <shape> opcode(operands), attrs`: the opcode is the first lower-case word
# followed by `(` after the `=`. Shapes never contain one (tuple shapes open with a bare
# `(`, TPU layouts use upper-case `T(`/`S(`).
_OPCODE = re.compile(r"=\s.*?(?<![\w\-.])([a-z][a-z0-9\-]*)\(")


def last_hlo() -> str:
    """The optimized, partitioned HLO text of the latest executed graph.

    Example::

        >>> (x * 2).cpu(); "multiply" in last_hlo()
        True
    """
    program = last_program()
    if program is None:
        raise RuntimeError("torchspmd: no graph has been executed yet, so there is no HLO")
    return program.optimized_hlo()


def _opcode(line: str) -> str | None:
    match = _OPCODE.search(line)
    return match.group(1) if match else None


def collectives(graph: str | None = None) -> dict[str, int]:
    """How many of each collective an HLO text (default: the latest graph's) contains.

    Counts instructions whose opcode is a collective; an async pair counts once (its
    ``-start``, never its ``-done``).

    Example::

        >>> collectives("%ag = f32[8]{0} all-gather(f32[2]{0} %p), dimensions={0}")
        {'all-gather': 1, 'all-reduce': 0, 'reduce-scatter': 0, 'all-to-all': 0, 'collective-permute': 0}
    """
    text = last_hlo() if graph is None else graph
    counts = dict.fromkeys(COLLECTIVES, 0)
    for line in text.splitlines():
        opcode = _opcode(line)
        if opcode is None:
            continue
        if opcode.endswith("-start"):
            opcode = opcode[: -len("-start")]
        if opcode in counts:
            counts[opcode] += 1
    return counts


_PARAMETER = re.compile(r"^\s*(%\S+) = .*?\bparameter\(\d+\)", re.MULTILINE)
_COPY_OF = re.compile(r"\bcopy\((?:[^%()]*\s)?(%[^),\s]+)\)")  # operand typed or not


def copied_arguments(graph: str | None = None) -> int:
    """How many of the entry computation's arguments an HLO text (default: the latest
    graph's) copies whole: work a step should not need when every donated buffer goes
    to its own tensor's new value (a copy means XLA could not update it in place).

    Example::

        >>> copied_arguments("ENTRY %main (p: f32[4]) -> f32[4] {\\n"
        ...                  "  %p = f32[4]{0} parameter(0)\\n"
        ...                  "  ROOT %copy = f32[4]{0} copy(%p)\\n}")
        1
    """
    text = last_hlo() if graph is None else graph
    entry = text[text.index("ENTRY"):] if "ENTRY" in text else text
    arguments = set(_PARAMETER.findall(entry))
    return sum(1 for name in _COPY_OF.findall(entry) if name in arguments)
