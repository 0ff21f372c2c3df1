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
    key: tuple
    operands: list[list[int]]  # per node: its operands as codes (see ``operand_code``)


def operand_code(position: int, index: int) -> int:
    """Operand ``index`` of pending node ``position`` (>= 0), or leaf ``~position`` (< 0)."""
    return position * 4096 + index if position >= 0 else position


def collect(roots: list[Node]) -> Graph:
    """Every pending node ``roots`` depend on, topologically ordered, and the graph key."""
    position: dict[Node, int] = {}
    leaf_position: dict[tuple[Node, int], int] = {}
    nodes: list[Node] = []
    leaves: list[tuple[Node, int]] = []
    for root in roots:
        stack = [root]
        while stack:
            node = stack[-1]
            if node in position:
                stack.pop()
                continue
            waiting = [n for n, _ in node.inputs if not n.is_leaf and n not in position]
            if waiting:
                stack.extend(waiting)
                continue
            for value in node.inputs:
                if value[0].is_leaf and value not in leaf_position:
                    leaf_position[value] = len(leaves)
                    leaves.append(value)
            position[node] = len(nodes)
            nodes.append(node)
            stack.pop()
    operands = [[operand_code(position[n], j) if not n.is_leaf else ~leaf_position[(n, j)]
                 for n, j in node.inputs] for node in nodes]
    key: list = []
    for node, codes in zip(nodes, operands):
        key.append(node.sig.id)
        key.append(len(codes))
        key.extend(codes)
    key.append(-1)
    key.extend(position[r] for r in roots)
    return Graph(nodes, leaves, list(roots), tuple(key), operands)
