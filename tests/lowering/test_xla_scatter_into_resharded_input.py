"""XLA miscompiles a scatter of one index into a replicated program input resharded by a
sharding constraint: plain JAX, ``with_sharding_constraint(x, P("d", None)).at[0].set(4)``
with ``x`` a replicated argument, gives the device that does not own row 0 the old row 0
in place of its own first row (JAX 0.10.2, Shardy and GSPMD alike). The update of the
partitioned scatter falls back to a dynamic slice of the whole input at the wrong index.
A transpose between the input and the constraint does the same; with the input sharded
on entry, or computed in the program, it is right.

torchspmd routes around it in ``runtime/program.resharded_inputs``: a constraint that lays
out an input (or views of one) is followed by an optimization barrier. When
``test_xla_still_miscompiles_a_scatter_into_a_resharded_input`` fails, XLA is fixed and
the barrier may go.
"""

import jax
import numpy as np
import pytest
import torch
from jax.sharding import Mesh as JaxMesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import torchspmd
from torchspmd.sharding import Mesh, annotate_custom_sharding

DEV = torchspmd.device()
ROWS = np.arange(24, dtype=np.float32).reshape(6, 4) - 12


def _set_row_0(barrier: bool) -> np.ndarray:
    mesh = JaxMesh(np.array(jax.devices()[:2]), ("d",))

    def update(x):
        x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P("d", None)))
        if barrier:
            x = jax.lax.optimization_barrier(x)
        return x.at[0].set(4.0)

    return np.asarray(jax.jit(update)(jax.device_put(ROWS, NamedSharding(mesh, P()))))


def _expected() -> np.ndarray:
    expected = ROWS.copy()
    expected[0] = 4
    return expected


def test_xla_still_miscompiles_a_scatter_into_a_resharded_input():
    """Drop the barrier in ``program.resharded_inputs`` when this fails."""
    wrong = _set_row_0(barrier=False)
    assert (wrong != _expected()).any()
    np.testing.assert_array_equal(wrong[3], ROWS[0])  # device 1's first row: the old row 0


def test_an_optimization_barrier_after_the_constraint_makes_it_right():
    np.testing.assert_array_equal(_set_row_0(barrier=True), _expected())


def _update(kind: str, t: torch.Tensor, dev) -> None:
    if kind == "index_fill_":
        t.index_fill_(0, torch.tensor([0], device=dev), 4)
    elif kind == "index_add_":
        t.index_add_(0, torch.tensor([5], device=dev), torch.ones(1, t.shape[1], dtype=t.dtype, device=dev))
    elif kind == "index_put_":
        t[torch.tensor([2], device=dev)] = 7
    else:
        t[0] = 4


@pytest.mark.parametrize("kind", ["index_fill_", "index_add_", "index_put_", "row assignment"])
@pytest.mark.parametrize("view", [False, True], ids=["annotated", "annotated transpose"])
def test_one_row_updates_of_device_data_annotated_over_a_sub_mesh_match_cpu(kind, view):
    def program(dev, mesh=None):
        t = torch.from_numpy(ROWS.T.copy() if view else ROWS.copy()).to(dev)
        t = t.t() if view else t
        if mesh is not None:
            annotate_custom_sharding(t, mesh, (0, None))
        _update(kind, t, dev)
        torchspmd.sync()
        return t.cpu()

    torch.testing.assert_close(program(DEV, Mesh([0, 1], (2,), ("d",))), program("cpu"),
                               rtol=0, atol=0)
