"""Mesh: PyTorch/XLA's API and messages, plus sub-meshes and value semantics."""

import re
from collections import OrderedDict

import numpy as np
import pytest

import torchspmd.jax_setup  # noqa: F401
import jax

from torchspmd.sharding.mesh import (
    HybridMesh,
    Mesh,
    get_1d_mesh,
    get_global_mesh,
    set_global_mesh,
)

N = len(jax.devices())


@pytest.fixture
def restore_global_mesh():
    saved = get_global_mesh()
    yield
    set_global_mesh(saved)


def test_mesh_keeps_ids_shape_and_names():
    mesh = Mesh(np.arange(8), (2, 4), ("x", "y"))
    assert mesh.device_ids.tolist() == list(range(8))
    assert mesh.mesh_shape == (2, 4)
    assert mesh.axis_names == ("x", "y")


def test_device_ids_become_a_numpy_array():
    assert isinstance(Mesh([0, 1], (2,)).device_ids, np.ndarray)


def test_device_ids_are_read_only():
    mesh = Mesh(np.arange(8), (8,))
    with pytest.raises(ValueError):
        mesh.device_ids[0] = 5


def test_mesh_copies_the_callers_ids():
    ids = np.arange(8)
    mesh = Mesh(ids, (8,))
    ids[0] = 7
    assert mesh.device_ids[0] == 0


def test_axis_names_default_to_none():
    assert Mesh(np.arange(8), (8,)).axis_names is None


def test_size_is_the_number_of_devices():
    assert Mesh(np.arange(8), (2, 4)).size() == 8


def test_shape_maps_names_to_sizes():
    assert Mesh(np.arange(8), (4, 2), ("x", "y")).shape() == OrderedDict([("x", 4), ("y", 2)])


def test_shape_of_unnamed_mesh_uses_axis_indices():
    assert Mesh(np.arange(8), (4, 2)).shape() == OrderedDict([(0, 4), (1, 2)])


def test_logical_mesh_is_ids_reshaped_row_major():
    mesh = Mesh(np.arange(8), (4, 2))
    assert mesh.get_logical_mesh().tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_axis_name_idx_finds_the_axis():
    assert Mesh(np.arange(8), (1, 8), ("x", "y")).get_axis_name_idx("y") == 1


def test_axis_name_idx_of_unknown_name_is_none():
    assert Mesh(np.arange(8), (1, 8), ("x", "y")).get_axis_name_idx("z") is None


def test_axis_name_idx_on_unnamed_mesh_is_none():
    assert Mesh(np.arange(8), (1, 8)).get_axis_name_idx("x") is None


def test_str_matches_pytorch_xla():
    mesh = Mesh(np.arange(8), (1, 8), ("x", "y"))
    expected = "{'device_ids': [0, 1, 2, 3, 4, 5, 6, 7], 'mesh_shape': (1, 8), 'axis_names': ('x', 'y')}"
    assert str(mesh) == expected


def test_str_of_unnamed_mesh_shows_none():
    assert str(Mesh([0, 1], (2,))) == "{'device_ids': [0, 1], 'mesh_shape': (2,), 'axis_names': None}"


def test_from_str_round_trips():
    mesh = Mesh([3, 1, 2, 0], (2, 2), ("a", "b"))
    assert Mesh.from_str(str(mesh)) == mesh


def test_from_str_of_garbage_is_none():
    assert Mesh.from_str("not a mesh") is None


def test_from_str_missing_field_is_none():
    assert Mesh.from_str("{'device_ids': [0, 1], 'mesh_shape': (2,)}") is None


def test_equal_meshes_compare_and_hash_equal():
    a = Mesh(np.arange(8), (2, 4), ("x", "y"))
    b = Mesh(list(range(8)), [2, 4], ["x", "y"])
    assert a == b and hash(a) == hash(b)


@pytest.mark.parametrize(
    "other",
    [
        Mesh(np.arange(8)[::-1], (2, 4), ("x", "y")),
        Mesh(np.arange(8), (4, 2), ("x", "y")),
        Mesh(np.arange(8), (2, 4), ("a", "y")),
        Mesh(np.arange(8), (2, 4)),
    ],
)
def test_meshes_differing_in_ids_shape_or_names_are_unequal(other):
    assert Mesh(np.arange(8), (2, 4), ("x", "y")) != other


def test_sub_mesh_of_some_devices_is_allowed():
    mesh = Mesh([2, 3], (1, 2), ("x", "y"))
    assert mesh.get_logical_mesh().tolist() == [[2, 3]]


def test_device_set_holds_the_ids():
    assert Mesh([5, 1, 3], (3,)).device_set() == frozenset({1, 3, 5})


def test_jax_devices_follow_mesh_order():
    assert [d.id for d in Mesh([5, 1, 3], (3,)).jax_devices()] == [5, 1, 3]


def test_jax_mesh_has_the_devices_in_mesh_layout():
    jmesh = Mesh([3, 2, 1, 0], (2, 2), ("x", "y")).get_jax_mesh()
    assert [[d.id for d in row] for row in jmesh.devices] == [[3, 2], [1, 0]]


def test_jax_mesh_uses_the_axis_names():
    assert Mesh(np.arange(8), (2, 4), ("x", "y")).get_jax_mesh().axis_names == ("x", "y")


def test_unnamed_jax_mesh_gets_generated_names():
    assert Mesh(np.arange(8), (2, 4)).get_jax_mesh().axis_names == ("_0", "_1")


def test_jax_mesh_is_cached():
    mesh = Mesh(np.arange(8), (2, 4))
    assert mesh.get_jax_mesh() is mesh.get_jax_mesh()


def _raises(message):
    return pytest.raises(AssertionError, match=re.escape(message))


def test_axis_names_must_match_mesh_dims():
    with _raises("Number of axis names (1) must match mesh dimensions (2)"):
        Mesh(np.arange(8), (2, 4), ("x",))


def test_axis_names_must_be_unique():
    with _raises("Axis names must be unique, got: ('x', 'x')"):
        Mesh(np.arange(8), (2, 4), ("x", "x"))


def test_id_count_must_match_mesh_size():
    with _raises("Number of device IDs (4) must match mesh size (8)"):
        Mesh(np.arange(4), (2, 4))


def test_device_ids_must_be_unique():
    with _raises("Device IDs must be unique, got: [0 0]"):
        Mesh([0, 0], (2,))


def test_device_ids_must_exist():
    with _raises(f"Device IDs must be less than the global number of devices ({N}), got: [0 {N}]"):
        Mesh([0, N], (2,))


def test_negative_device_ids_are_rejected():
    with _raises(f"Device IDs must be non-negative (indices into jax.devices(), 0 to {N - 1}), "
                 "got: [-1  0]"):
        Mesh([-1, 0], (2,))


def test_more_ids_than_devices_is_rejected():
    with _raises(
        f"Number of device IDs ({N + 1}) must be less than or equal to the global number of devices ({N})"
    ):
        Mesh(np.arange(N + 1), (N + 1,))


def test_1d_mesh_spans_all_devices():
    mesh = get_1d_mesh()
    assert mesh.mesh_shape == (N,) and mesh.device_ids.tolist() == list(range(N))


def test_1d_mesh_without_name_is_unnamed():
    assert get_1d_mesh().axis_names is None


def test_1d_mesh_with_name():
    assert get_1d_mesh("data").axis_names == ("data",)


def test_global_mesh_can_be_cleared(restore_global_mesh):
    set_global_mesh(get_1d_mesh())
    set_global_mesh(None)
    assert get_global_mesh() is None


def test_global_mesh_is_what_was_set(restore_global_mesh):
    mesh = get_1d_mesh("data")
    set_global_mesh(mesh)
    assert get_global_mesh() is mesh


def test_hybrid_mesh_on_one_slice_is_ici_shape_in_id_order():
    mesh = HybridMesh(ici_mesh_shape=(2, 4), axis_names=("data", "model"))
    assert mesh.mesh_shape == (2, 4)
    assert mesh.get_logical_mesh().tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_hybrid_mesh_with_all_ones_dcn_is_allowed_on_one_slice():
    assert HybridMesh(ici_mesh_shape=(1, 8), dcn_mesh_shape=(1, 1)).dcn_mesh_shape == (1, 1)


def test_hybrid_mesh_is_keyword_only():
    with pytest.raises(TypeError):
        HybridMesh((2, 4))


def test_hybrid_mesh_rejects_dcn_on_a_single_slice():
    with pytest.raises(ValueError, match="Invalid dcn_mesh_shape for single slice mesh"):
        HybridMesh(ici_mesh_shape=(1, 4), dcn_mesh_shape=(2, 1))


def test_hybrid_mesh_must_cover_all_devices():
    with pytest.raises(ValueError, match="has 4 devices, but there are"):
        HybridMesh(ici_mesh_shape=(2, 2))


def test_hybrid_mesh_equals_the_plain_mesh_it_builds():
    assert HybridMesh(ici_mesh_shape=(2, 4)) == Mesh(np.arange(8), (2, 4))
