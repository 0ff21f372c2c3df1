"""The collectives of an optimized HLO module, with the bytes each one moves per device.

:func:`torchspmd.debug.collectives` counts them; a planner needs their sizes too, and the
size of the group each runs over (a ring all-reduce over n devices sends
``2 (n-1)/n`` of its operand from each device).

Example::

    >>> [c.kind for c in read_collectives(
    ...     "%ag = f32[8,4]{1,0} all-gather(f32[2,4]{1,0} %p), replica_groups=[1,4]<=[4]")]
    ['all-gather']
"""

from __future__ import annotations

import dataclasses
import math
import re

__all__ = ["Collective", "CompiledCosts", "read_collectives", "read_compiled"]

_KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
# `%name = <result shape> opcode(`: the opcode is the last word before the first `(`
# that follows the shape.
_LINE = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.*?)\s*\b("
                   + "|".join(k for k in _KINDS) + r")(-start)?\(")
_ARRAY = re.compile(r"\b(pred|[suf]\d+|bf16|c64|c128)\[([\d,]*)\]")
_IOTA_GROUPS = re.compile(r"replica_groups=\[(\d+),(\d+)\]")
_LIST_GROUPS = re.compile(r"replica_groups=\{\{([\d,\s]*)\}")
_BITS = {"pred": 8, "bf16": 16, "c64": 64, "c128": 128}


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective instruction: its kind, the bytes of its result on one device, and
    how many devices take part in each of its groups (``group``)."""

    kind: str
    result_bytes: int
    group: int

    @property
    def sent_bytes(self) -> float:
        """Bytes one device sends for it on a ring (the usual algorithm's traffic)."""
        n = max(self.group, 1)
        share = (n - 1) / n
        if self.kind == "all-reduce":
            return 2 * share * self.result_bytes
        if self.kind == "reduce-scatter":
            return (n - 1) * self.result_bytes
        if self.kind == "collective-permute":
            return float(self.result_bytes)
        return share * self.result_bytes  # all-gather, all-to-all


def _array_bytes(dtype: str, dims: str) -> int:
    bits = _BITS.get(dtype) or int(dtype[1:])
    return math.prod(int(d) for d in dims.split(",") if d) * bits // 8


def _group(line: str, devices: int) -> int:
    iota = _IOTA_GROUPS.search(line)
    if iota:
        return int(iota.group(2))
    listed = _LIST_GROUPS.search(line)
    if listed:
        return len([d for d in listed.group(1).split(",") if d.strip()])
    return devices  # no groups: every device (source_target_pairs for a permute)


def read_collectives(hlo: str, devices: int = 1) -> list[Collective]:
    """Every collective in ``hlo`` (an async ``-start``/``-done`` pair once).

    ``devices``: the group size to assume when an instruction names no groups.

    Example::

        >>> read_collectives("%ar = f32[4]{0} all-reduce(f32[4]{0} %x), "
        ...                  "replica_groups={{0,1}}, to_apply=%add")
        [Collective(kind='all-reduce', result_bytes=16, group=2)]
    """
    found = []
    for line in hlo.splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        arrays = [_array_bytes(d, s) for d, s in _ARRAY.findall(match.group(1))]
        if not arrays:
            continue
        # An async start's result is (operand, result[, context]): the largest is the
        # result for a gather, the operand for a scatter; either bounds the traffic.
        size = max(arrays) if match.group(3) else sum(arrays)
        found.append(Collective(match.group(2), size, _group(line, devices)))
    return found


@dataclasses.dataclass(frozen=True)
class CompiledCosts:
    """What XLA says about one compiled program, per device: its ``cost_analysis()``
    flops and bytes accessed, its collectives, and its ``memory_analysis()``."""

    flops: float
    bytes_accessed: float
    collectives: tuple[Collective, ...]
    memory: object  # jax's CompiledMemoryStats


def read_compiled(compiled, devices: int) -> CompiledCosts:
    """:class:`CompiledCosts` of a ``jax.stages.Compiled`` running on ``devices`` devices.

    Example: ``read_compiled(jax.jit(f).lower(x).compile(), 1).flops``.
    """
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost  # one entry per program
    return CompiledCosts(float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0)),
                         tuple(read_collectives(compiled.as_text(), devices)),
                         compiled.memory_analysis())
