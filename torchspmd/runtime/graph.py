"""Graph collection: the pending nodes a set of roots needs, in order, and the graph's key.

The key is structural: each node's interned signature id and where its operands come
from (a position in the order, or a leaf's position). Two steps of a training loop have
the same key, whatever data they hold, so the second one hits the compile cache.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchspmd.lazy.node import Node


@dataclass
class Graph:
    nodes: list[Node]  # pending nodes, operands before users
    leaves: list[tuple[Node, int]]  # data values the graph reads, in first-use order
    roots: list[Node]  # the nodes whose outputs are wanted
    wanted: list[tuple[int, ...]]  # per root: the output indices to return
    key: tuple
    operands: list[list[int]]  # per node: its operands as codes (see ``OUTPUTS``)


# An operand code packs (node position, output index): position * OUTPUTS + index for
# output ``index`` of pending node ``position``, or ``~position`` (< 0) for leaf ``position``.
OUTPUTS = 4096


def collect(roots: list[Node], wanted: dict | None = None) -> Graph:
    """Every pending node ``roots`` depend on, topologically ordered, and the graph key.

    ``wanted`` maps a root to the output indices live tensors use (default: every tensor
    output); the others are not returned, so XLA need not keep them.
    """
    position: dict[Node, int] = {}
    leaf_position: dict[tuple[Node, int], int] = {}
    nodes: list[Node] = []
    leaves: list[tuple[Node, int]] = []
    operands: list[list[int]] = []
    key: list = []
    # Runs once per sync over every pending node: ``Node.is_leaf`` is spelled out (a
    # property call per operand costs more than the rest of the walk).
    for root in roots:
        stack = [root]
        while stack:
            node = stack[-1]
            if node in position:
                stack.pop()
                continue
            waiting = False
            for n, _ in node.inputs:
                if n.arrays is None and n.host is None and n not in position:
                    stack.append(n)
                    waiting = True
            if waiting:
                continue
            codes = []
            for value in node.inputs:
                n = value[0]
                if n.arrays is None and n.host is None:
                    codes.append(position[n] * OUTPUTS + value[1])  # an operand code (see OUTPUTS)
                    continue
                leaf = leaf_position.get(value)
                if leaf is None:
                    leaf = leaf_position[value] = len(leaves)
                    leaves.append(value)
                codes.append(~leaf)
            position[node] = len(nodes)
            nodes.append(node)
            operands.append(codes)
            key.append(node.sig.id)
            key.append(len(codes))
            key.extend(codes)
            stack.pop()
    outputs = [_tensor_outputs(r) if wanted is None or r not in wanted else tuple(sorted(wanted[r]))
               for r in roots]
    key.append(-1)
    for r, outs in zip(roots, outputs):
        key.append(position[r])
        key.extend(outs)
        key.append(-2)
    return Graph(nodes, leaves, list(roots), outputs, tuple(key), operands)


def _tensor_outputs(node: Node) -> tuple[int, ...]:
    return tuple(i for i, m in enumerate(node.sig.outputs) if m is not None)
