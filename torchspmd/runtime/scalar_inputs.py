"""A program's scalar inputs: the Python numbers of a graph, as three vectors.

Python numbers used as values are graph inputs (``ScalarSlot``), so that a new value never
recompiles. A program takes them as one vector per kind (float, int, bool: three
arguments, not one per number; a call costs host time per argument), and its replay
slices each number out. Equal numbers (``graph.repeats``) share one position: see
``runtime/graph.py`` for why.

Example::

    positions, index = vector_layout([float, int, float], ((2, 0),))
    vectors = vectors_of(program, [0.5, 3, 0.5])    # [array([0.5]), array([3]), array([])]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from torchspmd.lazy.node import ScalarSlot
from torchspmd.lowering import RANDOM_OPS

__all__ = ["SCALAR_KINDS", "VECTOR_DTYPES", "scalar_kinds", "vector_layout", "vectors_of",
           "unstack"]

SCALAR_KINDS = (float, int, bool)
VECTOR_DTYPES = (np.float64, np.int64, np.bool_)


def scalar_kinds(sig) -> list:
    """The kinds of a node signature's scalar inputs, in template order (a random op's
    seed last)."""
    kinds = []

    def visit(item):
        if isinstance(item, ScalarSlot):
            kinds.append(float if item.kind is float else int if item.kind is int else bool)
        elif isinstance(item, tuple):
            for i in item:
                visit(i)

    for a in sig.template:
        visit(a)
    for _, v in sig.kw_template:
        visit(v)
    if sig.op in RANDOM_OPS:
        kinds.append(int)
    return kinds


def vector_layout(kinds: list, repeats: tuple) -> tuple[list[list[int]], list[int]]:
    """Per scalar vector (``SCALAR_KINDS``), the flat positions of the values it holds; and
    per flat scalar, its index in its vector. A repeat (``(position, earlier)``, same type
    and value, so same kind) takes its earlier scalar's index.

    Example::

        >>> vector_layout([float, int, float], ((2, 0),))
        ([[0], [1], []], [0, 0, 0])
    """
    earlier = dict(repeats)
    positions: list[list[int]] = [[] for _ in SCALAR_KINDS]
    index: list[int] = []
    for i, kind in enumerate(kinds):
        if i in earlier:
            index.append(index[earlier[i]])
            continue
        vector = positions[SCALAR_KINDS.index(kind)]
        index.append(len(vector))
        vector.append(i)
    return positions, index


def vectors_of(program: Any, flat: list) -> list[np.ndarray]:
    """The scalar vectors (float, int, bool) ``program`` takes for a graph's flat list of
    scalars. Example: ``vectors_of(program, [s for n in graph.nodes for s in n.scalars])``."""
    return [np.array([flat[i] for i in positions], dtype=dt)
            for positions, dt in zip(program.vector_positions, VECTOR_DTYPES)]


def unstack(vector) -> list:
    """A traced vector's elements, one scalar each."""
    return [vector[i] for i in range(vector.shape[0])]
