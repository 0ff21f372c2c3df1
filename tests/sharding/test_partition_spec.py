"""Partition specs: validation (PyTorch/XLA's errors), normalization, JAX shardings."""

import re

import numpy as np
import pytest

import torchspmd.jax_setup  # noqa: F401
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from torchspmd.sharding.hlo_text import ShardingType
from torchspmd.sharding.mesh import Mesh
from torchspmd.sharding.partition_spec import (
    check_rank,
    jax_partition_spec,
    named_sharding,
    normalize,
    sharding_type,
    spec_key,
)


@pytest.fixture
def mesh():
    return Mesh(np.arange(8), (1, 2, 4), ("r", "b", "m"))


def test_int_entries_become_one_axis_tuples(mesh):
    assert normalize(mesh, (2, None)) == ((2,), None)


def test_names_become_axis_indices(mesh):
    assert normalize(mesh, ("m", "b")) == ((2,), (1,))


def test_tuple_entries_keep_their_axis_order(mesh):
    assert normalize(mesh, (("m", 0), None)) == ((2, 0), None)


def test_list_specs_are_accepted(mesh):
    assert normalize(mesh, ["r", None]) == normalize(mesh, ("r", None))


def test_empty_tuple_entry_means_replicated(mesh):
    assert normalize(mesh, ((), 1)) == (None, (1,))


def test_scalar_spec_is_empty(mesh):
    assert normalize(mesh, ()) == ()


def test_spec_must_be_a_sequence(mesh):
    with pytest.raises(TypeError):
        normalize(mesh, "rb")


def test_nested_tuples_are_rejected(mesh):
    with pytest.raises(AssertionError, match="Partition spec cannot contain nested tuples"):
        normalize(mesh, ((0, (1,)), None))


def test_unknown_axis_name_is_a_value_error(mesh):
    with pytest.raises(ValueError, match="Axis name z is not defined in the given mesh"):
        normalize(mesh, ("z", None))


def test_axis_name_on_unnamed_mesh_is_a_value_error():
    with pytest.raises(ValueError, match="Axis name x is not defined in the given mesh"):
        normalize(Mesh(np.arange(8), (2, 4)), ("x",))


@pytest.mark.parametrize("entry", [1.0, True, [0, 1], np.int64(0)])
def test_other_entry_types_are_value_errors(mesh, entry):
    message = f"Spec type {type(entry)} is not supported in partition spec"
    with pytest.raises(ValueError, match=re.escape(message)):
        normalize(mesh, (entry, None))


@pytest.mark.parametrize("spec", [(3, None), (-1, None), ((0, 3), None)])
def test_out_of_bound_axis_index_is_rejected(mesh, spec):
    message = f"partition_spec ({spec}) contains out of bound index into mesh_shape."
    with pytest.raises(AssertionError, match=re.escape(message)):
        normalize(mesh, spec)


@pytest.mark.parametrize("spec", [(1, 1), ((0, 1), 1), ((2, 2), None)])
def test_reused_axis_is_rejected(mesh, spec):
    message = f"Each device mesh dimension should appear at most once in partition_spec {spec}."
    with pytest.raises(AssertionError, match=re.escape(message)):
        normalize(mesh, spec)


def test_error_messages_show_the_spec_with_names_translated(mesh):
    with pytest.raises(AssertionError, match=re.escape("partition_spec ((1, 2), 2).")):
        normalize(mesh, (("b", "m"), "m"))


def test_cache_does_not_mistake_true_for_one(mesh):
    normalize(mesh, (1, None))
    with pytest.raises(ValueError):
        normalize(mesh, (True, None))


def test_spec_key_tells_equal_values_of_other_types_apart():
    assert spec_key((1,)) != spec_key((True,)) != spec_key((1.0,))


def test_spec_key_of_unhashable_spec_is_none():
    assert spec_key(([0, 1],)) is None


def test_rank_check_passes_on_matching_length():
    check_rank((0, None), 2)


def test_rank_check_message_matches_pytorch_xla():
    message = "Partition spec length (1) should be equal to the input rank (2)."
    with pytest.raises(AssertionError, match=re.escape(message)):
        check_rank((0,), 2)


def test_jax_partition_spec_uses_axis_names(mesh):
    assert jax_partition_spec(mesh, (("r", 2), None)) == P(("r", "m"), None)


def test_jax_partition_spec_of_unnamed_mesh_uses_generated_names():
    assert jax_partition_spec(Mesh(np.arange(8), (2, 4)), (1, 0)) == P("_1", "_0")


def test_named_sharding_is_over_the_meshs_jax_mesh(mesh):
    sharding = named_sharding(mesh, ("b", "m"))
    assert isinstance(sharding, NamedSharding)
    assert sharding.mesh is mesh.get_jax_mesh()
    assert sharding.spec == P("b", "m")


def test_named_sharding_is_cached(mesh):
    assert named_sharding(mesh, (0, None)) is named_sharding(mesh, [0, None])


def test_named_sharding_of_sub_mesh_uses_its_devices():
    sharding = named_sharding(Mesh([2, 3], (1, 2), ("x", "y")), ("x", "y"))
    assert {d.id for d in sharding.device_set} == {2, 3}


@pytest.mark.parametrize(
    "shape, spec, expected",
    [
        ((1, 8), (None, 1), ShardingType.TILED),
        ((1, 8), (0, None), ShardingType.REPLICATED),
        ((1, 8), (0, 1), ShardingType.TILED),
        ((2, 4), (0, None), ShardingType.PARTIAL),
        ((2, 4), (None, None), ShardingType.REPLICATED),
        ((2, 4), (), ShardingType.REPLICATED),
        ((2, 4, 1), (0, 1), ShardingType.TILED),
    ],
)
def test_sharding_type_is_read_back_from_the_final_string(shape, spec, expected):
    assert sharding_type(Mesh(np.arange(8), shape), spec) is expected


def test_sharding_type_on_a_one_device_mesh_is_replicated():
    assert sharding_type(Mesh([3], (1,)), (0,)) is ShardingType.REPLICATED
