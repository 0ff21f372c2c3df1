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
    leaves: list[Node]  # data the graph reads, in first-use order
    roots: list[Node]  # the nodes whose outputs are wanted
    key: tuple


def collect(roots: list[Node]) -> Graph:
    """Every pending node ``roots`` depend on, topologically ordered, and the graph key."""
    position: dict[Node, int] = {}  # node -> index in nodes; leaf -> ~index in leaves
    nodes: list[Node] = []
    leaves: list[Node] = []
    for root in roots:
        stack = [root]
        while stack:
            node = stack[-1]
            if node in position:
                stack.pop()
                continue
            if node.is_leaf:
                position[node] = ~len(leaves)
                leaves.append(node)
                stack.pop()
                continue
            waiting = [n for n, _ in node.inputs if n not in position]
            if waiting:
                stack.extend(waiting)
                continue
            position[node] = len(nodes)
            nodes.append(node)
            stack.pop()
    key: list = []
    for node in nodes:
        key.append(node.sig.id)
        key.append(len(node.inputs))
        for operand, index in node.inputs:
            key.append(position[operand])
            key.append(index)
    key.append(-1)
    key.extend(position[r] for r in roots)
    return Graph(nodes, leaves, list(roots), tuple(key))
