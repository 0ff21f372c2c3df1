"""Manual-sharding regions: ops between full_to_shard and shard_to_full see local blocks.

Inside the compiled program such a region becomes one ``jax.shard_map`` body over the
region's mesh: its inputs are the global values entering ``full_to_shard`` (split by the
region's partition specs), its outputs the local values reaching ``shard_to_full``.

A tensor still holding local blocks when ``sync()`` runs (``local`` below, alive until the
loop rebinds it) is left pending, as PyTorch/XLA leaves it: only its global result is
computed. Reading a local block's value on the host is refused (``check_region``)::

    local = enable_manual_sharding(x, ("a", None), mesh=mesh).global_tensor * 2
    y = disable_manual_sharding(local, ("a", None), x.shape, mesh=mesh).global_tensor
    torchspmd.sync()    # computes y; ``local`` stays pending
"""

from __future__ import annotations

import jax
from jax.sharding import PartitionSpec

from torchspmd.lazy.node import Node
from torchspmd.lazy.weak_set import WeakRegistry
from torchspmd.lowering.annotation_ops import FULL_TO_SHARD, SHARD_TO_FULL
from torchspmd.lowering.xla_shardings import mesh_in_id_order
from torchspmd.runtime.graph import OUTPUTS


# The entries (``full_to_shard`` nodes) of manual regions recorded and still referenced: a
# registry the design names. While it is empty no pending value can be a local block, and
# ``local_blocks`` spares walking the pending graph.
ENTRIES = WeakRegistry()


def note_entry(node: Node) -> None:
    """Record ``node``, a region's ``full_to_shard``, for :func:`is_local_block`."""
    ENTRIES.add(node)


def is_local_block(value: tuple[Node, int], clean: set | None = None) -> bool:
    """Whether ``value`` is a local block: computed from a manual region's entry
    (``full_to_shard``) without leaving the region (``shard_to_full``) on the way.

    ``clean`` (shared between calls) collects nodes known to reach no entry, so that a
    walk over many values visits each pending node once.

    >>> is_local_block(current_value(enable_manual_sharding(x, (0,), mesh=m)))  # doctest: +SKIP
    True
    """
    if next(iter(ENTRIES), None) is None:
        return False  # no region is live: spare walking a large graph
    clean = set() if clean is None else clean
    seen, stack = set(), [value[0]]
    while stack:
        node = stack.pop()
        if node in seen or node in clean or node.is_leaf or node.sig.op is SHARD_TO_FULL:
            continue
        if node.sig.op is FULL_TO_SHARD:
            return True
        seen.add(node)
        stack.extend(n for n, _ in node.inputs)
    clean |= seen
    return False


def local_blocks(values: list) -> list[bool]:
    """Per value of ``values`` (a pending value, or None): whether it is a local block."""
    if next(iter(ENTRIES), None) is None:
        return [False] * len(values)
    clean: set = set()
    return [value is not None and not value[0].is_leaf and is_local_block(value, clean)
            for value in values]


def manual_steps(steps: list) -> dict[int, int]:
    """The steps that compute on local blocks (entries included, exits not), each mapped
    to its region: the index of the region's first entry. Regions that share a body step
    are one region; a graph may hold several, one after another (a loop's steps, say)."""
    region: dict[int, int] = {}
    for i, (sig, operands) in enumerate(steps):
        if sig.op is FULL_TO_SHARD:
            region[i] = i
        elif sig.op is not SHARD_TO_FULL:
            joined = sorted({region[c // OUTPUTS] for c in operands
                             if c >= 0 and c // OUTPUTS in region})
            if joined:
                region[i] = joined[0]
                for j, r in region.items():  # a step joining two regions merges them
                    if r in joined[1:]:
                        region[j] = joined[0]
    return region


def exit_region(steps: list, manual: dict[int, int], i: int) -> int | None:
    """The region whose local block the exit ``steps[i]`` (a ``shard_to_full``) reassembles."""
    code = steps[i][1][0]
    return manual.get(code // OUTPUTS) if code >= 0 else None


def check_region(steps: list, manual: frozenset[int], roots: list) -> None:
    """Refuse what a shard_map body cannot express, naming the op and the fix."""
    for i in sorted(manual):
        sig, operands = steps[i]
        if sig.op is FULL_TO_SHARD:
            continue
        for c in operands:
            if c < 0 or c // OUTPUTS not in manual:
                raise NotImplementedError(
                    f"torchspmd: {sig.op} inside a manual-sharding region mixes a local block "
                    "with a global tensor. Bring the global tensor in with "
                    "enable_manual_sharding too.")
    for position, _ in roots:
        if position in manual:
            raise RuntimeError(
                "torchspmd: a manually sharded tensor (local blocks) was read. Call "
                "disable_manual_sharding on it first to get the global tensor back.")


def run_region(steps, manual, values, operand, lower, step_scalars, region: int) -> None:
    """Compute every exit of the manual region ``region`` into ``values`` with one shard_map."""
    inside = sorted(i for i, r in manual.items() if r == region)
    entries = [i for i in inside if steps[i][0].op is FULL_TO_SHARD]
    body_steps = [i for i in inside if steps[i][0].op is not FULL_TO_SHARD]
    exits = [i for i, (sig, _) in enumerate(steps)
             if sig.op is SHARD_TO_FULL and exit_region(steps, manual, i) == region]
    mesh = mesh_in_id_order(steps[entries[0]][0].template[1].mesh)  # programs run in id order
    scalars = [step_scalars[i] for i in body_steps]

    def body(local_inputs, scalars):
        local = {i: [x] for i, x in zip(entries, local_inputs)}
        for i, s in zip(body_steps, scalars):
            sig, operands = steps[i]
            local[i] = lower(sig, [local[c // OUTPUTS][c % OUTPUTS] for c in operands], s)
        return [local[steps[i][1][0] // OUTPUTS][steps[i][1][0] % OUTPUTS] for i in exits]

    mapped = jax.shard_map(
        body, mesh=mesh, check_vma=False,
        in_specs=([steps[i][0].template[1].spec for i in entries],
                  [[PartitionSpec()] * len(s) for s in scalars]),
        out_specs=[steps[i][0].template[1].spec for i in exits])
    outputs = mapped([operand(steps[i][1][0]) for i in entries], scalars)
    for i, out in zip(exits, outputs):
        values[i] = [out]
