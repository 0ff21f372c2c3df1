"""What XLA will be given, before anything runs: the pending graph of chosen tensors.

- :func:`pending_hlo`: the HLO module (text) of the graph those tensors need, with the
  sharding annotations the partitioner will read (PyTorch/XLA's ``_get_xla_tensors_hlo``);
- :func:`propagated_shardings`: the sharding XLA's propagation gives each of them, read
  from the compiled program (for intermediates ``get_sharding`` says ``''`` until they
  are computed).

Neither runs the graph, uploads host data or changes any tensor. Example::

    y = (x @ w).relu()                       # pending
    print(torchspmd.debug.pending_hlo([y]))
    torchspmd.debug.propagated_shardings([y])   # ['{devices=[8,1]0,1,2,3,4,5,6,7}']
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
import torch

from torchspmd.jax_setup import devices
from torchspmd.lazy.node import Node
from torchspmd.lowering.xla_shardings import in_id_order, placement_for
from torchspmd.lowering.annotation_ops import FULL_TO_SHARD, SHARD_TO_FULL, SHARDING_CONSTRAINT
from torchspmd.runtime import placement
from torchspmd.runtime.graph import Graph, collect
from torchspmd.runtime.metrics import COUNTERS
from torchspmd.runtime.program import Program
from torchspmd.runtime.scalar_inputs import vectors_of
from torchspmd.sharding import state
from torchspmd.sharding.hlo_text import sharding_to_hlo_text

__all__ = ["pending_hlo", "pending_program", "propagated_shardings"]

Value = tuple[Node, int]
_ANNOTATIONS = (SHARDING_CONSTRAINT, FULL_TO_SHARD, SHARD_TO_FULL)


def _values(tensors: Sequence[torch.Tensor], caller: str) -> list[Value]:
    if isinstance(tensors, torch.Tensor):
        raise TypeError(f"{caller}: pass a list of tensors ([t]), got one tensor")
    return [state.as_spmd_tensor(t, caller).handle.value() for t in tensors]


def _graph(values: list[Value]) -> Graph | None:
    """The pending graph ``values`` need (``None`` if they all hold data)."""
    wanted: dict[Node, set[int]] = {}
    for node, index in values:
        if not node.is_leaf:
            wanted.setdefault(node, set()).add(index)
    if not wanted:
        return None
    return collect(sorted(wanted, key=lambda n: n.seq), wanted)


def _device_ids(graph: Graph) -> tuple[int, ...]:
    """The devices the graph would run on: those its inputs and annotations name."""
    shardings = []
    for node, index in graph.leaves:
        if node.host is not None:
            if node.sharding is not None:
                shardings.append(node.sharding)
        else:
            shardings.append(node.arrays[index].sharding)
    shardings += [node.sig.template[1] for node in graph.nodes if node.sig.op in _ANNOTATIONS]
    try:
        ids = placement.target_devices(shardings)
    except placement.MeshMismatchError as error:
        raise NotImplementedError(
            f"torchspmd.debug: these tensors' pending work spans several device sets ({error}) "
            "and would run as one program per set; ask for the tensors of one set at a "
            "time.") from None
    return ids if ids is not None else tuple(range(len(devices())))


def _leaf_layout(node: Node, index: int, ids: tuple[int, ...]) -> jax.ShapeDtypeStruct:
    """A graph input as the program would receive it, without uploading or moving it."""
    if node.host is not None:
        host = np.asarray(node.host)
        shape, dtype = host.shape, host.dtype
        sharding = (placement_for(node.sharding, shape) if node.sharding is not None
                    else placement.replicated_on(ids))
    else:
        array = node.arrays[index]
        shape, dtype, sharding = array.shape, array.dtype, array.sharding
    if placement.device_ids(sharding) == frozenset(ids):
        sharding = in_id_order(sharding, len(shape))
    elif sharding.is_fully_replicated:
        sharding = placement.replicated_on(ids)
    else:
        raise placement.MeshMismatchError(
            f"torchspmd: a tensor sharded over devices {sorted(placement.device_ids(sharding))} "
            f"cannot join a computation on devices {list(ids)}; reshard it onto that mesh first.")
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def _lowered(graph: Graph):
    """``jax.jit(...).lower(...)`` of the graph's program: traced, not compiled or run."""
    ids = _device_ids(graph)
    program = Program(graph)
    flat = [s for n in graph.nodes for s in n.scalars]
    vectors = vectors_of(program, flat)
    layouts = [_leaf_layout(node, i, ids) for node, i in graph.leaves]
    traced = COUNTERS["graphs_compiled"]
    try:
        return program.jitted.lower(layouts, *vectors)
    finally:
        COUNTERS["graphs_compiled"] = traced  # a look, not a compilation for the metrics


def pending_hlo(tensors: Sequence[torch.Tensor]) -> str:
    """The HLO module (text) of the pending graph ``tensors`` need, before anything runs.

    The module is what ``sync()`` would hand XLA for them, before partitioning: inputs
    carry their layouts (``sharding={...}`` on each parameter) and every
    ``mark_sharding``/``annotate_custom_sharding`` on a pending value is a
    ``Sharding`` custom call. ``''`` when every tensor already holds data. As in any
    compiled program, device ids in the module are positions in the program's device
    list (its devices in increasing id order); ``propagated_shardings`` shows real ids.

    Example::

        >>> y = x * 2; mark_sharding(y, mesh, ("x", None))
        >>> "custom_call_target=\\"Sharding\\"" in pending_hlo([y])
        True
    """
    graph = _graph(_values(tensors, "pending_hlo"))
    if graph is None:
        return ""
    return _lowered(graph).as_text(dialect="hlo")


def pending_program(tensors: Sequence[torch.Tensor]):
    """The ``jax.stages.Lowered`` program of the pending graph ``tensors`` need (None if
    they all hold data): ``.compile()`` it for XLA's ``cost_analysis()``,
    ``memory_analysis()`` and optimized HLO, without running anything.

    Example::

        >>> y = (x @ x.T).relu()
        >>> pending_program([y]).compile().cost_analysis()["flops"] > 0   # doctest: +SKIP
        True
    """
    graph = _graph(_values(tensors, "pending_program"))
    return None if graph is None else _lowered(graph)


def propagated_shardings(tensors: Sequence[torch.Tensor]) -> list[str]:
    """The sharding XLA gives each of ``tensors`` when it compiles their pending graph.

    Compiles (no run): each tensor is an output of the program with no layout asked
    for, so its sharding is what XLA's propagation chose from the annotations around it.
    A tensor that holds data reports its current sharding (``get_sharding``).

    Example::

        >>> mark_sharding(x, mesh, ("x", None))
        >>> propagated_shardings([(x * 2).sum(dim=1)])   # get_sharding would say ''
        ['{devices=[8]0,1,2,3,4,5,6,7}']
    """
    values = _values(tensors, "propagated_shardings")
    graph = _graph(values)
    found: dict[Value, str] = {}
    if graph is not None:
        compiled = _lowered(graph).compile()
        for (root, outputs), shardings in zip(zip(graph.roots, graph.wanted),
                                              compiled.output_shardings):
            for index, sharding in zip(outputs, shardings):
                found[(root, index)] = sharding_to_hlo_text(
                    sharding, len(root.sig.outputs[index].shape))
    texts = []
    for t, value in zip(tensors, values):
        texts.append(found[value] if value in found else
                     state.current_text(state.as_spmd_tensor(t, "propagated_shardings")))
    return texts
