"""Buffer donation: which input buffers a program may consume, because no one reads them again.

A donated buffer is handed to XLA (``jax.jit(..., donate_argnums=...)``), which may write
the program's outputs into it; afterwards the array is deleted. Parameters and optimizer
state updated in place thus need one copy of their memory, not two. The rule, for both
compiled steps and the lazy ``sync()``: a buffer is donated only when nothing but the
value being replaced holds it. Who else holds a buffer is ``ownership``'s question (its
docstring has the contract); this module adds what a program can use: on the lazy path,
only buffers an output of the same shape and dtype can take.

Example::

    donate = lazy_donations(graph, inputs, flying)   # indices into graph.leaves
    COUNTERS["donated_bytes"]                        # grows by their bytes when it runs
"""

from __future__ import annotations

from torchspmd.lazy.node import TensorMeta
from torchspmd.lowering.dtypes import to_jax_dtype
from torchspmd.runtime import ownership_check  # noqa: F401  (calibrates ownership at import)
from torchspmd.runtime.graph import Graph
from torchspmd.runtime.ownership import unheld_leaves

__all__ = ["lazy_donations", "output_avals", "NOT_USABLE"]

# JAX warns when a donated buffer matches no output; the lazy path donates only buffers
# an output of the same shape and dtype can take, but a layout may still differ.
NOT_USABLE = "Some donated buffers were not usable"


def lazy_donations(graph: Graph, inputs: list, flying: set[int],
                   avals: dict | None = None) -> tuple[int, ...]:
    """The positions in ``graph.leaves`` (and ``inputs``, their placed arrays) whose
    buffers the run of ``graph`` may donate.

    A leaf qualifies when, once the graph has run, no one can read it
    (``ownership.unheld_leaves``) and an output of the same shape and dtype can reuse
    the buffer (``avals``: :func:`output_avals` of the graph, if the caller keeps them).
    """
    candidates = unheld_leaves(graph, inputs, flying)
    if not candidates:
        return ()
    room = dict(output_avals(graph) if avals is None else avals)
    donate = []
    leaves = graph.leaves
    for position in candidates:
        leaf, index = leaves[position]
        array = leaf.arrays[index]
        aval = (tuple(array.shape), array.dtype)
        if room.get(aval, 0) > 0:
            room[aval] -= 1
            donate.append(position)
    return tuple(donate)


def output_avals(graph: Graph) -> dict[tuple, int]:
    """How many outputs of each shape and JAX dtype the run of ``graph`` returns.

    Structural (the graph key fixes it), so a program works it out once. Keys hold NumPy
    dtypes, as ``jax.Array.dtype`` gives them (a bare ``jnp.float32`` hashes otherwise).
    Example: ``output_avals(graph)[((4, 8), np.dtype("float32"))] == 2``.
    """
    avals: dict[tuple, int] = {}
    for root, outs in zip(graph.roots, graph.wanted):
        for i in outs:
            meta = root.sig.outputs[i]
            if isinstance(meta, TensorMeta):
                aval = (tuple(meta.shape), to_jax_dtype(meta.dtype))
                avals[aval] = avals.get(aval, 0) + 1
    return avals
