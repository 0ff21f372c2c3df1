"""Graph collection: the pending nodes a set of roots needs, in order, and the graph's key.

The key is structural: each node's interned signature id and where its operands come
from (a position in the order, or a leaf's position). Two steps of a training loop have
the same key, whatever data they hold, so the second one hits the compile cache.

Python numbers are graph inputs (``ScalarSlot``), yet the key records which of them are
equal (``repeats``): equal numbers share one input, so the same op in every layer (a
norm's ``eps``, attention's scale) reads the same input and XLA compiles the fused
kernel once for all layers, not once per layer (each kernel reading its own position of
the scalar vector is a different kernel: a 24-layer model's first compile took ~1.5x
JAX's). A value that later equals, or stops equalling, another gives another key: one
more program, never a wrong one.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchspmd.lazy.node import Node
from torchspmd.lowering import RANDOM_OPS
from torchspmd.lowering.linalg import matmul_precision_setting


@dataclass
class Graph:
    nodes: list[Node]  # pending nodes, operands before users
    leaves: list[tuple[Node, int]]  # data values the graph reads, in first-use order
    roots: list[Node]  # the nodes whose outputs are wanted
    wanted: list[tuple[int, ...]]  # per root: the output indices to return
    key: tuple
    operands: list[list[int]]  # per node: its operands as codes (see ``OUTPUTS``)
    # (position, earlier position) in the flat list of the nodes' scalars, for each
    # scalar equal to an earlier one (same type and value; -0.0 is not 0.0)
    repeats: tuple[tuple[int, int], ...] = ()


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
    first: dict = {}  # (type, value) of each scalar seen -> its position
    repeats: list[tuple[int, int]] = []
    flat = 0  # scalars before the current node's
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
            scalars = node.scalars
            if scalars:
                # A random op's seed is drawn anew each call: it never shares.
                if node.sig.op not in RANDOM_OPS:
                    for i, s in enumerate(scalars, flat):
                        # repr tells -0.0 from 0.0 (equal, and hashed alike)
                        earlier = first.setdefault((s.__class__, s if s else repr(s)), i)
                        if earlier != i:
                            repeats.append((i, earlier))
                flat += len(scalars)
            stack.pop()
    outputs = [_tensor_outputs(r) if wanted is None or r not in wanted else tuple(sorted(wanted[r]))
               for r in roots]
    key.append(-1)
    for pair in repeats:
        key.extend(pair)
    key.append(-1)
    for r, outs in zip(roots, outputs):
        key.append(position[r])
        key.extend(outs)
        key.append(-2)
    # The lowering reads torch.set_float32_matmul_precision: another setting, another program.
    key.append(matmul_precision_setting())
    return Graph(nodes, leaves, list(roots), outputs, tuple(key), operands, tuple(repeats))


def _tensor_outputs(node: Node) -> tuple[int, ...]:
    return tuple(i for i, m in enumerate(node.sig.outputs) if m is not None)
