"""Buffer donation: which input buffers a program may consume, because no one reads them again.

A donated buffer is handed to XLA (``jax.jit(..., donate_argnums=...)``), which may write
the program's outputs into it; afterwards the array is deleted. Parameters and optimizer
state updated in place thus need one copy of their memory, not two. The rule, for both
compiled steps and the lazy ``sync()``: a buffer is donated only when nothing but the
value being replaced holds it. Another live tensor (a zero-copy ``copy_`` target, a
``detach()``, a view, a tensor kept from an earlier step), a pending computation
outside this run, or another array over the same buffers (``aliases``) keeps it; when
unsure, it is not donated, so no one ever sees "Array has been deleted".

The holders are counted with ``sys.getrefcount``: every holder of a graph value is one
reference to it, and the references the runtime itself holds are known exactly.

Example::

    donate = lazy_donations(graph, inputs)   # indices into graph.leaves
    COUNTERS["donated_bytes"]                # grows by their bytes when the program runs
"""

from __future__ import annotations

import sys
from torchspmd.lazy.node import TensorMeta
from torchspmd.lowering.dtypes import to_jax_dtype
from torchspmd.runtime.aliases import shares_buffers
from torchspmd.runtime.graph import Graph
from torchspmd.runtime.placement import device_ids

__all__ = ["exclusive", "lazy_donations", "output_avals", "NOT_USABLE"]

# JAX warns when a donated buffer matches no output; the lazy path donates only buffers
# an output of the same shape and dtype can take, but a layout may still differ.
NOT_USABLE = "Some donated buffers were not usable"


def exclusive(values: list, arrays: list, indices: list[int], flying: set[int]) -> list[bool]:
    """For each of ``indices``: whether the leaf ``values[i]`` and its array ``arrays[i]``
    are held only by the one storage that a compiled step overwrites (so donating the
    buffer cannot break another tensor)."""
    getrefcount = sys.getrefcount
    alone = []
    for i in indices:
        value = values[i]
        node = value[0]
        array = arrays[i]
        # Expected references: to the tuple, the storage's ``value``, ``values``, this
        # local and getrefcount's; to the node, that tuple, this local and getrefcount's;
        # to the array, ``node.arrays``, ``arrays``, this local, getrefcount's, and the
        # in-flight list if there.
        alone.append(getrefcount(value) <= 4 and getrefcount(node) <= 3
                     and getrefcount(array) <= 4 + (id(array) in flying)
                     and not shares_buffers(array))
    return alone


def lazy_donations(graph: Graph, inputs: list, flying: set[int],
                   avals: dict | None = None) -> tuple[int, ...]:
    """The positions in ``graph.leaves`` (and ``inputs``, their placed arrays) whose
    buffers the run of ``graph`` may donate.

    A leaf qualifies when, once the graph has run, no one can read it: only this graph's
    pending nodes refer to it (its tensor now holds this run's output, or was dropped),
    its array belongs to it alone, and an output of the same shape and dtype can reuse
    the buffer (``avals``: :func:`output_avals` of the graph, if the caller keeps them). If a pending node of the graph is held from outside (a stale view, an
    intermediate something else still needs), it may run again later and read its
    inputs: then nothing is donated.
    """
    # References each value tuple gets from inside the graph: the nodes' inputs tuples
    # and ``graph.leaves``. Anything beyond them is a holder outside this run.
    # Plain dicts, not Counters: a Counter's missing key is a Python call, and this
    # runs over every operand of every sync.
    internal: dict[int, int] = {}
    tuples: dict[int, tuple] = {}
    for node in graph.nodes:
        for value in node.inputs:
            key = id(value)
            internal[key] = internal.get(key, 0) + 1
            tuples[key] = value
    for value in graph.leaves:
        key = id(value)
        internal[key] = internal.get(key, 0) + 1
    # Per node: how many distinct value tuples that only the graph holds refer to it.
    # Keyed by the nodes themselves (their hash is their identity, computed in C): no
    # ``id`` call per use.
    held: dict = {}
    outside: set = set()
    value = node = leaf = array = placed = None  # the loops' locals, counted below
    for value in tuples.values():
        # References: ``tuples``, this local, getrefcount's argument, plus the graph's.
        if sys.getrefcount(value) == 3 + internal[id(value)]:
            node = value[0]
            held[node] = held.get(node, 0) + 1
        else:
            outside.add(value[0])
    value = node = None
    roots = set(graph.roots)
    for node in graph.nodes:
        if node in roots:
            continue  # becomes a leaf holding its outputs: it reads no input again
        # References: ``graph.nodes``, this local, getrefcount's argument, the tuples,
        # and ``held``'s key or ``outside``.
        if node in outside or sys.getrefcount(node) != 4 + held.get(node, 0):
            return ()
    node = None
    room = dict(output_avals(graph) if avals is None else avals)
    donate = []
    # Indexed, not zipped: zip and enumerate keep their last item, one more reference.
    for position in range(len(graph.leaves)):
        leaf, index = graph.leaves[position]
        placed = inputs[position]
        if leaf.arrays is None or leaf in outside:
            continue
        array = leaf.arrays[index]
        aval = (tuple(array.shape), array.dtype)
        # References to the leaf: the tuples, this local, getrefcount's argument, ``held``'s
        # key if there (a leaf in ``outside`` was skipped above). To the
        # array: ``leaf.arrays``, the local ``array``, getrefcount's argument, the
        # in-flight list if there, and if it was placed as it is, ``inputs`` and the
        # local ``placed``. An array placed anew over the same devices is the same
        # buffers relabeled (donating it deletes the original too, which no one reads);
        # one placed on other devices may lend only some of them: not donated.
        if placed is array:
            array_refs = 5
        elif device_ids(placed.sharding) == device_ids(array.sharding):
            array_refs = 3
            # The relabeled array: ``inputs``, the local ``placed``, getrefcount's.
            if sys.getrefcount(placed) != 3:
                continue
        else:
            continue
        if (room.get(aval, 0) > 0 and sys.getrefcount(leaf) == 2 + (leaf in held) + held.get(leaf, 0)
                and sys.getrefcount(array) == array_refs + (id(array) in flying)
                and not shares_buffers(array, ignore=placed)):
            room[aval] -= 1
            donate.append(position)
    return tuple(donate)


def output_avals(graph: Graph) -> dict[tuple, int]:
    """How many outputs of each shape and JAX dtype the run of ``graph`` returns.

    Structural (the graph key fixes it), so a program works it out once.
    Example: ``output_avals(graph)[((4, 8), jnp.float32)] == 2``.
    """
    avals: dict[tuple, int] = {}
    for root, outs in zip(graph.roots, graph.wanted):
        for i in outs:
            meta = root.sig.outputs[i]
            if isinstance(meta, TensorMeta):
                aval = (tuple(meta.shape), to_jax_dtype(meta.dtype))
                avals[aval] = avals.get(aval, 0) + 1
    return avals
