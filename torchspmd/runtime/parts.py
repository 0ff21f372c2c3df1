"""A graph's independent computations: roots that no pending node joins.

Independent computations of one graph may run on different device sets (one program
each, see ``execute``), and when a program fails each is retried alone, so that one
failure does not take the others with it (see ``failure``).
"""

from __future__ import annotations

from torchspmd.lowering.annotation_ops import FULL_TO_SHARD, SHARD_TO_FULL, SHARDING_CONSTRAINT
from torchspmd.runtime.graph import OUTPUTS

__all__ = ["Parts"]


class Parts:
    """A graph's independent computations: the roots, leaves and annotations of each.

    Two roots belong to one computation when a pending node joins them; a shared input
    does not. Structural, so it is worked out once per compiled program.

    Example::

        parts = Parts(collect([a_node, b_node]))
        parts.roots     # [[0], [1]] when a and b share no pending node
    """

    __slots__ = ("roots", "leaves", "annotations")

    def __init__(self, graph):
        parent = list(range(len(graph.nodes)))

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        for i, codes in enumerate(graph.operands):
            for code in codes:
                if code >= 0:
                    parent[find(code // OUTPUTS)] = find(i)
        position = {n: i for i, n in enumerate(graph.nodes)}
        ids = {}
        component = [ids.setdefault(find(position[r]), len(ids)) for r in graph.roots]
        self.roots = [[] for _ in ids]
        self.leaves = [set() for _ in ids]
        self.annotations = [[] for _ in ids]
        for r, c in enumerate(component):
            self.roots[c].append(r)
        for i, (node, codes) in enumerate(zip(graph.nodes, graph.operands)):
            c = ids.get(find(i))
            if c is None:
                continue  # feeds no root (not the case for collected graphs)
            self.leaves[c].update(~code for code in codes if code < 0)
            if node.sig.op in (SHARDING_CONSTRAINT, FULL_TO_SHARD, SHARD_TO_FULL):
                self.annotations[c].append(node.sig.template[1])
