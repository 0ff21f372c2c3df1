"""Graph collection: the pending nodes a set of roots needs, in order, and the graph's key.

The key is structural: each node's interned signature id and where its operands come
from (a position in the order, or a leaf's position). Two steps of a training loop have
the same key, whatever data they hold, so the second one hits the compile cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

from torchspmd.lazy.node import Node


@dataclass
class Graph:
    nodes: list[Node]  # pending nodes, operands before users
    leaves: list[tuple[Node, int]]  # data values the graph reads, in first-use order
    roots: list[Node]  # the nodes whose outputs are wanted
    wanted: list[tuple[int, ...]]  # per root: the output indices to return
    key: tuple
    operands: list[list[int]]  # per node: its operands as codes (see ``operand_code``)


# An operand code packs (node position, output index): position * OUTPUTS + index.
OUTPUTS = 4096


def operand_code(position: int, index: int) -> int:
    """Operand ``index`` of pending node ``position`` (>= 0), or leaf ``~position`` (< 0)."""
    return position * OUTPUTS + index if position >= 0 else position


def collect(roots: list[Node], wanted: dict | None = None) -> Graph:
    """Every pending node ``roots`` depend on, topologically ordered, and the graph key.

    ``wanted`` maps a root to the output indices live tensors use (default: every tensor
    output); the others are not returned, so XLA need not keep them.
    """
    # The pending nodes ``roots`` reach. Runs once per sync over every pending node and
    # operand: ``Node.is_leaf`` is spelled out (a property call per operand costs more
    # than the rest of the walk).
    seen = set(roots)
    stack = list(roots)
    while stack:
        for value in stack.pop().inputs:
            n = value[0]
            if n.arrays is None and n.host is None and n not in seen:
                seen.add(n)
                stack.append(n)
    # Creation order is a topological order (a node's operands exist before it does),
    # and the same for every run of the same step.
    nodes = sorted(seen, key=_SEQ)
    position = {n: i for i, n in enumerate(nodes)}
    leaf_position: dict[tuple[Node, int], int] = {}
    leaves: list[tuple[Node, int]] = []
    operands: list[list[int]] = []
    key: list = []
    for node in nodes:
        codes = []
        for value in node.inputs:
            p = position.get(value[0])
            if p is not None:
                codes.append(p * OUTPUTS + value[1])  # operand_code
                continue
            leaf = leaf_position.get(value)
            if leaf is None:
                leaf = leaf_position[value] = len(leaves)
                leaves.append(value)
            codes.append(~leaf)
        operands.append(codes)
        key.append(node.sig.id)
        key.append(len(codes))
        key.extend(codes)
    outputs = [_tensor_outputs(r) if wanted is None or r not in wanted else tuple(sorted(wanted[r]))
               for r in roots]
    key.append(-1)
    for r, outs in zip(roots, outputs):
        key.append(position[r])
        key.extend(outs)
        key.append(-2)
    return Graph(nodes, leaves, list(roots), outputs, tuple(key), operands)


_SEQ = attrgetter("seq")


def _tensor_outputs(node: Node) -> tuple[int, ...]:
    return tuple(i for i, m in enumerate(node.sig.outputs) if m is not None)
