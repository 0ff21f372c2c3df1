"""XLA miscompiles a tiled operand whose tile assignment is not an iota over the program's
device assignment: plain JAX, a (4, 2) mesh of the devices in id order, ``P("a", "b")``
with Shardy's ``_logical_device_ids`` (the device order of a permuted mesh), gives a wrong
``jax.grad`` of ``x @ w.T`` (GSPMD too). The same layout as a plain JAX ``Mesh`` whose
device order is the permutation (device assignment = mesh order) is right.

torchspmd routes around it in ``lowering/xla_shardings.in_id_order``: XLA is only given
iota tile orders (a permuted mesh's data is stored as the same spec over its devices in id
order). When ``test_xla_still_miscompiles_logical_device_ids`` fails, XLA is fixed: the
workaround may go (logical device ids would keep each block on the mesh's own device).
"""

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

PERMUTATION = (1, 0, 3, 5, 6, 4, 7, 2)


def _operands():
    rng = np.random.default_rng(0)
    x = rng.integers(-4, 5, (16, 8)).astype(np.float32)
    w = rng.integers(-4, 5, (4, 8)).astype(np.float32)
    return x, w


def _loss(w, x):
    y = x @ w.T
    return (y * y).sum()


def _weight_gradient(x_sharding, w_sharding):
    x, w = _operands()
    grad = jax.jit(jax.grad(_loss))
    return np.asarray(grad(jax.device_put(w, w_sharding), jax.device_put(x, x_sharding)))


def test_xla_still_miscompiles_logical_device_ids():
    """Drop the workaround in ``xla_shardings.in_id_order`` when this fails."""
    x, w = _operands()
    expected = np.asarray(jax.grad(_loss)(w, x))
    in_id_order = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("a", "b"))
    tiled = NamedSharding(in_id_order, P("a", "b"), _logical_device_ids=PERMUTATION)
    wrong = _weight_gradient(tiled, NamedSharding(in_id_order, P()))
    assert np.abs(wrong - expected).max() > 0


def test_the_same_layout_over_a_permuted_device_assignment_is_right():
    x, w = _operands()
    expected = np.asarray(jax.grad(_loss)(w, x))
    permuted = Mesh(np.array(jax.devices())[list(PERMUTATION)].reshape(4, 2), ("a", "b"))
    right = _weight_gradient(NamedSharding(permuted, P("a", "b")), NamedSharding(permuted, P()))
    np.testing.assert_array_equal(right, expected)
