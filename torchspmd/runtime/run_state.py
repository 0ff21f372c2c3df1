"""What ``execute`` learns running a program, kept on it (``Program.state``).

- its graph's independent computations (``Parts``), worked out once;
- the layouts its inputs had the last time every one entered it as it was: a training
  loop feeds a program the outputs of its previous run, whose shardings are the same
  objects step after step, so one identity test per input then stands for working out
  placements and placing each input;
- the bytes each set of donated inputs gives (the graph key fixes the shapes).

Example::

    state = program.state
    state.input_layouts = InputLayouts.of(graph, inputs, target)   # after placing
    inputs = state.input_layouts.inputs(graph)   # next time: the arrays, or None
"""

from __future__ import annotations

from dataclasses import dataclass, field

import jax

from torchspmd.runtime.failure import FailedValue
from torchspmd.runtime.graph import Graph
from torchspmd.runtime.parts import Parts
from torchspmd.runtime.transfer import upload_leaf

__all__ = ["RunState", "InputLayouts"]


@dataclass(frozen=True)
class InputLayouts:
    """Per input position: its array's sharding object and its leaf's annotation (host
    data), and the devices the program ran on (``None``: every device).

    >>> InputLayouts.of(graph, inputs, None).target is None  # doctest: +SKIP
    True
    """

    shardings: tuple
    target: tuple[int, ...] | None
    annotations: tuple

    @classmethod
    def of(cls, graph: Graph, inputs: list, target) -> "InputLayouts | None":
        """The layouts of ``inputs`` (placed for ``graph``), or None if any input was moved
        to enter the program (then it does not enter as it is next time either)."""
        for (leaf, index), placed in zip(graph.leaves, inputs):
            if placed is not leaf.arrays[index]:
                return None
        return cls(tuple(a.sharding for a in inputs), target,
                   tuple(leaf.sharding for leaf, _ in graph.leaves))

    def inputs(self, graph: Graph) -> list[jax.Array] | None:
        """The graph's input arrays if each has the layout recorded for its position (then
        each enters the program as it is, on the same devices), else None."""
        shardings, annotations = self.shardings, self.annotations
        # Host data is uploaded as it is annotated: only with last time's annotations does
        # it take last time's layouts (else placement must see the annotations themselves,
        # with no leaf uploaded yet).
        for position, (leaf, _) in enumerate(graph.leaves):
            if leaf.host is not None and leaf.sharding is not annotations[position]:
                return None
        inputs = []
        for position, (leaf, index) in enumerate(graph.leaves):
            if leaf.host is not None:
                upload_leaf(leaf)
            array = leaf.arrays[index]
            if (array is None or type(array) is FailedValue
                    or array.sharding is not shardings[position]):
                return None  # the usual path raises what it must
            inputs.append(array)
        return inputs


@dataclass
class RunState:
    """One program's run-time memo (see the module docstring); starts empty.

    >>> RunState().bytes_donated([np.ones(4)], (0,))  # doctest: +SKIP
    32
    """

    parts: Parts | None = None
    input_layouts: InputLayouts | None = None
    donated_bytes: dict[tuple[int, ...], int] = field(default_factory=dict)

    def bytes_donated(self, inputs: list, donate: tuple[int, ...]) -> int:
        """The bytes of ``inputs`` at positions ``donate``, worked out once per set."""
        count = self.donated_bytes.get(donate)
        if count is None:
            count = self.donated_bytes[donate] = sum(inputs[i].nbytes for i in donate)
        return count
