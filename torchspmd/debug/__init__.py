"""Debugging aids: sharding pictures, the HLO before and after compiling, metrics.

Example::

    import torchspmd.debug as d
    d.pending_hlo([y])              # what XLA will be given for y (nothing runs)
    d.pending_program([y])          # the same as a jax Lowered: .compile().cost_analysis()
    d.propagated_shardings([y])     # the sharding XLA's propagation gives y
    print(d.tensor_debug_info(y))   # pending or data, its node, its sharding
    d.visualize_tensor_sharding(x)
    d.collectives()                 # collectives in the latest executed program
    d.copied_arguments()            # arguments it copies (a donated buffer not reused)
    print(d.compare_programs(step, jax_fn, *args))  # a compiled step's size next to JAX's
    d.metrics_report()
"""

from __future__ import annotations

import rich.console
import rich.table

from torchspmd.debug.describe import tensor_debug_info
from torchspmd.debug.hlo import collectives, copied_arguments, last_hlo
from torchspmd.debug.pending import pending_hlo, pending_program, propagated_shardings
from torchspmd.debug.program_size import (ProgramComparison, ProgramSize, compare_programs,
                                           program_size)
from torchspmd.device import bounds, index_checks as _index_checks
from torchspmd.debug.visualize import visualize_sharding
from torchspmd.runtime.metrics import metrics
from torchspmd.runtime.shape_changes import ShapeRecompileWarning
from torchspmd.sharding.api import get_sharding

__all__ = ["ShapeRecompileWarning", "visualize_sharding", "visualize_tensor_sharding",
           "last_hlo", "collectives",
           "copied_arguments", "compare_programs", "program_size", "ProgramSize",
           "ProgramComparison", "metrics_report", "check_indices", "index_checks", "pending_hlo", "pending_program",
           "propagated_shardings",
           "tensor_debug_info", "_get_xla_tensors_hlo", "_get_xla_tensor_debug_info"]

# PyTorch/XLA's names (``torch_xla._XLAC``), so debugging code ports unchanged.
_get_xla_tensors_hlo = pending_hlo
_get_xla_tensor_debug_info = tensor_debug_info


def check_indices(on: bool = True) -> None:
    """Make indexing ops raise PyTorch's error for an index out of range (slow: debugging).

    XLA clamps out-of-range reads and drops out-of-range writes; checked, each indexing op
    (``x[idx]``, ``x[idx] = v``, ``gather``, ``scatter``, ``index_select``, ``embedding``,
    ``take``, ``index_add_``...) reads its index tensor to the host first. Also on with
    ``TORCHSPMD_CHECK_INDICES=1`` in the environment.

    Example::

        >>> check_indices(True)
        >>> torch.zeros(3, device="spmd")[torch.tensor([5], device="spmd")]  # doctest: +SKIP
        IndexError: index 5 is out of bounds for dimension 0 with size 3
    """
    bounds.set_enabled(on)


def index_checks(on: bool = True) -> bool:
    """Turn the default in-graph index-range checks on or off; returns the previous setting.

    On by default (off with ``TORCHSPMD_INDEX_CHECKS=0``): each indexing op also computes, in
    its graph, whether an index is out of range, and an ``IndexError`` naming the op is
    raised at a later ``sync()`` or host read, or after a ``torchspmd.compile`` step (no
    host sync per op). :func:`check_indices` is the precise, slow mode that names the line.

    Example::

        >>> previous = index_checks(False)   # e.g. to time a step without them
        >>> index_checks(previous)  # doctest: +SKIP
    """
    previous = _index_checks.enabled()
    _index_checks.set_enabled(on)
    return previous


def visualize_tensor_sharding(t, **kwargs) -> rich.table.Table:
    """Draw ``t``'s current sharding (``visualize_sharding(get_sharding(t))``).

    Example::

        >>> mark_sharding(x, mesh, (0, 1)); visualize_tensor_sharding(x)  # doctest: +SKIP
    """
    return visualize_sharding(get_sharding(t), **kwargs)


def metrics_report(print_table: bool = True) -> rich.table.Table:
    """A table of ``torchspmd.metrics()`` (printed unless ``print_table=False``).

    Example::

        >>> table = metrics_report(print_table=False)
        >>> table.row_count >= 1
        True
    """
    table = rich.table.Table(title="torchspmd metrics")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in metrics().items():
        table.add_row(name, f"{value:.4f}" if isinstance(value, float) else str(value))
    if print_table:
        rich.console.Console().print(table)
    return table
