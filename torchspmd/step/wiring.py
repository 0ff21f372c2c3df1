"""How a captured step's program connects to the step's state, worked out once per plan:
where each value the step hands out comes from, which inputs the program may consume,
and the order in which it returns its outputs.

Example::

    refs, sigs, count = output_refs(captured)      # ("out", k, i) / ("in", leaf, i)
    donated = donated_sources(captured, sources)    # sources the step overwrites
    order, refs = output_order(captured, sources, refs, donated, [], count)
"""

from __future__ import annotations

from torchspmd.step.capture import Captured


def output_refs(captured: Captured) -> tuple[list, list, int]:
    """For each value the step hands out (``captured.values``): ``("out", k, index)``, the
    program's flat output ``k``, or ``("in", leaf, index)``, an input handed back
    unchanged; each value's signature; and how many flat outputs the program has."""
    graph = captured.graph
    flat_index = {}
    for root, outs in zip(graph.roots, graph.wanted):
        for i in outs:
            flat_index[(root, i)] = len(flat_index)
    leaf_index = {leaf: k for k, leaf in enumerate(graph.leaves)}
    refs, sigs = [], []
    for node, index in captured.values:
        if (node, index) in flat_index:
            refs.append(("out", flat_index[(node, index)], index))
        elif (node, index) in leaf_index:
            refs.append(("in", leaf_index[(node, index)], index))
        else:
            raise NotImplementedError(
                "torchspmd.compile: the step hands out data it did not compute or read "
                "(a tensor made from host data and kept); create it outside the step")
        sigs.append(node.sig)
    return refs, sigs, len(flat_index)


def donated_sources(captured: Captured, sources: list) -> list[int]:
    """Sources the step overwrites: their old buffers can go to the program."""
    written = set()
    for target in captured.targets:
        if target[0] == "arg":
            written.add(("arg", target[1]))
        elif target[0] == "storage":
            written.add(("storage", target[1]()))
    donated = []
    for i, source in enumerate(sources):
        if source[0] == "arg":
            overwritten = source in written
        elif source[0] == "storage":
            overwritten = ("storage", source[1]()) in written
        else:
            overwritten = False
        if overwritten or i in captured.substitutions.values():
            donated.append(i)
    return donated


def output_order(captured: Captured, sources: list, refs: list, donated: list[int],
                 spare_flats: list[int], count: int) -> tuple[list[int], list]:
    """The program's ``count`` outputs in the order it returns them: first the new value
    of each donated input, in the donated inputs' order, then the new gradients that take
    recycled buffers (``spare_flats``, see ``recycle.py``); and ``refs`` renumbered.

    JAX gives each donated buffer to the first output of its shape and dtype still
    without one. Listed in any other order, a parameter's buffer could go to another
    parameter's new value of the same shape while it is still to be read: XLA then
    copies every such input first (92 copies of parameters and moments in the benchmark's
    step). The lazy path does the same (``program._paired_first``)."""
    writes = {}  # what a source is, as a target that writes it -> output position
    for target, ref in zip(captured.targets, refs):
        if ref[0] == "out" and target[0] in ("arg", "storage"):
            key = target[1] if target[0] == "arg" else target[1]()
            writes.setdefault((target[0], key), ref[1])
    for j, i in captured.substitutions.items():  # a slot refilled: its new tensor
        if refs[j][0] == "out":
            writes.setdefault(("index", i), refs[j][1])
    order = []
    for i in donated:
        kind, ref = sources[i]
        flat = writes.get((kind, ref if kind == "arg" else ref()), writes.get(("index", i)))
        if flat is not None and flat not in order:
            order.append(flat)
    order += [j for j in spare_flats if j not in order]
    chosen = set(order)
    order += [j for j in range(count) if j not in chosen]
    position = {j: k for k, j in enumerate(order)}
    return order, [("out", position[r[1]], r[2]) if r[0] == "out" else r for r in refs]
