"""Wrong calls get an error that names the argument and what to do (issue 9 §5).

Each case here used to crash inside JAX, raise an unclear error, or be silently accepted.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import torchspmd
from torchspmd.sharding import (Mesh, XLAShard, disable_manual_sharding,
                                enable_manual_sharding, get_1d_mesh, get_global_mesh,
                                mark_sharding, set_global_mesh)

DEV = torchspmd.device()
N = torchspmd.device_count()


@pytest.mark.parametrize("ids, shape, names, error, message", [
    ([-1, 0], (2,), None, AssertionError, "Device IDs must be non-negative"),
    ([0, 1], 2, None, TypeError, "mesh_shape must be a sequence of ints"),
    ([], (0,), None, ValueError, "every mesh_shape entry must be >= 1"),
    ([], (), None, ValueError, "a mesh needs at least one device"),
    ([0.0, 1.5], (2,), None, TypeError, "device_ids must be ints"),
    ([0, 1], (-1, -2), None, ValueError, "every mesh_shape entry must be >= 1"),
    ([0, 1], (1, 2), (0, 1), TypeError, "axis names must be strings"),
], ids=["negative_id", "int_shape", "empty", "no_devices", "float_ids", "negative_shape",
        "int_axis_names"])
def test_mesh_rejects(ids, shape, names, error, message):
    with pytest.raises(error, match=re.escape(message)):
        Mesh(ids, shape, names)


@pytest.mark.parametrize("tensor, mesh, spec, error, message", [
    (lambda: torch.ones(8, device=DEV), get_1d_mesh, lambda: None, TypeError,
     "mark_sharding: partition_spec must be a tuple"),
    (lambda: [1.0] * 8, get_1d_mesh, lambda: (0,), TypeError,
     "mark_sharding: expected a torch.Tensor on the spmd device, got builtins.list"),
    (lambda: np.ones(8), get_1d_mesh, lambda: (0,), TypeError,
     "expected a torch.Tensor on the spmd device, got numpy.ndarray"),
    (lambda: torch.ones(8, device=DEV), lambda: None, lambda: (0,), TypeError,
     "mark_sharding: mesh must be a torchspmd Mesh, got None"),
    (lambda: torch.ones(8, device=DEV), lambda: get_1d_mesh().get_jax_mesh(), lambda: (0,),
     TypeError, "A jax.sharding.Mesh is not accepted"),
    (lambda: torch.ones(8), get_1d_mesh, lambda: (0,), RuntimeError,
     "Expected XLA tensor (an spmd tensor). Got: torch.FloatTensor"),
], ids=["spec_none", "list", "numpy", "mesh_none", "jax_mesh", "cpu_tensor"])
def test_mark_sharding_rejects(tensor, mesh, spec, error, message):
    with pytest.raises(error, match=re.escape(message)):
        mark_sharding(tensor(), mesh(), spec())


def test_set_global_mesh_rejects_what_is_not_a_mesh():
    with pytest.raises(TypeError, match="set_global_mesh: mesh must be a torchspmd Mesh or None"):
        set_global_mesh("x")
    assert get_global_mesh() is None or isinstance(get_global_mesh(), Mesh)


@pytest.mark.parametrize("device", ["spmd:3", "spmd:1"])
def test_a_device_index_other_than_zero_is_refused(device):
    with pytest.raises(RuntimeError, match=re.escape("one spmd device, spmd:0") + ".*" +
                       re.escape(f"got {device}")):
        torch.ones(2).to(device)
    with pytest.raises(RuntimeError, match="one spmd device"):
        torch.zeros(2, device=device)


def test_load_local_shards_refuses_data_of_another_dtype():
    x = torch.arange(8).to(DEV)
    xst = mark_sharding(x, get_1d_mesh(), (0,))
    shards = [XLAShard(s.data.float() + 0.5, s.indices, s.shard_device, s.replica_id)
              for s in xst.local_shards]
    with pytest.raises(RuntimeError, match=r"is torch.float32, the tensor is torch.int64"):
        xst.load_local_shards_(shards)
    assert x.cpu().tolist() == list(range(8))


def test_disable_manual_sharding_refuses_a_spec_that_does_not_fit_the_blocks():
    mesh = Mesh(list(range(N)), (2, N // 2))
    local = enable_manual_sharding(torch.zeros(8, 8).to(DEV), (0, 1), mesh=mesh)
    with pytest.raises(ValueError, match=r"local blocks of shape \(4, 2\) do not make a \(8, 8\)"):
        disable_manual_sharding(local * 2, (1, 0), (8, 8), mesh=mesh)


def test_disable_manual_sharding_refuses_another_mesh():
    mesh = Mesh(list(range(N)), (2, N // 2))
    local = enable_manual_sharding(torch.zeros(8, 8).to(DEV), (0, 1), mesh=mesh)
    with pytest.raises(ValueError, match="mesh must be the one the region was entered with"):
        disable_manual_sharding(local, (0, 1), (8, 8), mesh=Mesh(list(range(N)), (N // 2, 2)))


def test_mesh_and_spec_checks_raise_one_error_that_is_pytorch_xlas_assertion_and_a_value_error():
    from torchspmd.sharding import InvalidShardingError

    with pytest.raises(InvalidShardingError) as raised:
        Mesh([0, 1], (3,))
    assert isinstance(raised.value, AssertionError) and isinstance(raised.value, ValueError)
    with pytest.raises(InvalidShardingError, match="out of bound index"):
        mark_sharding(torch.ones(8, device=DEV), Mesh(list(range(N)), (N,)), (1,))


def test_no_check_is_an_assert_statement_so_python_optimize_keeps_them_all():
    """``python -O`` strips ``assert`` statements: every check in the library is an explicit
    raise (the raised ``InvalidShardingError`` *is* an ``AssertionError``, for PyTorch/XLA's
    callers, but is never raised by ``assert``). Read from the sources, not by starting
    ``python -O`` (which compiles torch's and JAX's sources again: ~15 s)."""
    import ast
    from pathlib import Path

    package = Path(torchspmd.__file__).parent
    found = [f"{path.relative_to(package.parent)}:{node.lineno}"
             for path in sorted(package.rglob("*.py"))
             for node in ast.walk(ast.parse(path.read_text(), str(path)))
             if isinstance(node, ast.Assert)
             or (isinstance(node, ast.Name) and node.id == "__debug__")]
    assert found == [], found
