"""Partition specs: validation (PyTorch/XLA's errors), resolution into a MeshSpec, JAX shardings."""

import re

import numpy as np
import pytest

import torchspmd.jax_setup  # noqa: F401
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from torchspmd.sharding.hlo_text import ShardingType, sharding_type
from torchspmd.sharding.mesh import Mesh
from torchspmd.sharding.partition_spec import (
    MeshSpec,
    check_spec,
    named_sharding,
    resolve,
    spec_key,
)


@pytest.fixture
def mesh():
    return Mesh(np.arange(8), (1, 2, 4), ("r", "b", "m"))


def axes(mesh, spec):
    return resolve(mesh, spec).axes


def test_int_entries_become_one_axis_tuples(mesh):
    assert axes(mesh, (2, None)) == ((2,), None)


def test_names_become_axis_indices(mesh):
    assert axes(mesh, ("m", "b")) == ((2,), (1,))


def test_tuple_entries_keep_their_axis_order(mesh):
    assert axes(mesh, (("m", 0), None)) == ((2, 0), None)


def test_list_specs_are_accepted(mesh):
    assert axes(mesh, ["r", None]) == axes(mesh, ("r", None))


def test_empty_tuple_entry_means_replicated(mesh):
    assert axes(mesh, ((), 1)) == (None, (1,))


def test_scalar_spec_is_empty(mesh):
    assert axes(mesh, ()) == ()


def test_spec_must_be_a_sequence(mesh):
    with pytest.raises(TypeError, match="Partition spec must be a tuple or a list"):
        resolve(mesh, "rb")


def test_nested_tuples_are_rejected(mesh):
    with pytest.raises(AssertionError, match="Partition spec cannot contain nested tuples"):
        resolve(mesh, ((0, (1,)), None))


def test_unknown_axis_name_is_a_value_error(mesh):
    with pytest.raises(ValueError, match="Axis name z is not defined in the given mesh"):
        resolve(mesh, ("z", None))


def test_axis_name_on_unnamed_mesh_is_a_value_error():
    with pytest.raises(ValueError, match="Axis name x is not defined in the given mesh"):
        resolve(Mesh(np.arange(8), (2, 4)), ("x",))


@pytest.mark.parametrize("entry", [1.0, True, [0, 1], np.int64(0)])
def test_other_entry_types_are_value_errors(mesh, entry):
    message = f"Spec type {type(entry)} is not supported in partition spec"
    with pytest.raises(ValueError, match=re.escape(message)):
        resolve(mesh, (entry, None))


@pytest.mark.parametrize("spec", [(3, None), (-1, None), ((0, 3), None)])
def test_out_of_bound_axis_index_is_rejected(mesh, spec):
    message = f"partition_spec ({spec}) contains out of bound index into mesh_shape."
    with pytest.raises(AssertionError, match=re.escape(message)):
        resolve(mesh, spec)


@pytest.mark.parametrize("spec", [(1, 1), ((0, 1), 1), ((2, 2), None)])
def test_reused_axis_is_rejected(mesh, spec):
    message = f"Each device mesh dimension should appear at most once in partition_spec {spec}."
    with pytest.raises(AssertionError, match=re.escape(message)):
        resolve(mesh, spec)


def test_error_messages_show_the_spec_with_names_translated(mesh):
    with pytest.raises(AssertionError, match=re.escape("partition_spec ((1, 2), 2).")):
        resolve(mesh, (("b", "m"), "m"))


def test_cache_does_not_mistake_true_for_one(mesh):
    resolve(mesh, (1, None))
    with pytest.raises(ValueError):
        resolve(mesh, (True, None))


def test_spec_key_tells_equal_values_of_other_types_apart():
    assert spec_key((1,)) != spec_key((True,)) != spec_key((1.0,))


def test_spec_key_of_unhashable_spec_is_none():
    assert spec_key(([0, 1],)) is None


# -- the rank --------------------------------------------------------------------------


def test_rank_is_one_per_entry(mesh):
    assert resolve(mesh, (("r", "m"), None, 1)).rank == 3


def test_rank_check_passes_on_matching_length():
    check_spec((0, None), 2, "mark_sharding")


def test_rank_check_message_matches_pytorch_xla():
    message = "Partition spec length (1) should be equal to the input rank (2)."
    with pytest.raises(AssertionError, match=re.escape(message)):
        check_spec((0,), 2, "mark_sharding")


def test_resolve_checks_the_rank_it_is_given(mesh):
    message = "Partition spec length (1) should be equal to the input rank (2)."
    with pytest.raises(AssertionError, match=re.escape(message)):
        resolve(mesh, (0,), 2)


def test_resolve_checks_the_rank_before_the_axes(mesh):
    with pytest.raises(AssertionError, match=re.escape("should be equal to the input rank")):
        resolve(mesh, ("z",), 2)


def test_resolve_names_its_caller_when_the_spec_is_not_a_sequence(mesh):
    with pytest.raises(TypeError, match=re.escape("mark_sharding: partition_spec must be a tuple")):
        resolve(mesh, "rb", 2, "mark_sharding")


# -- the value -------------------------------------------------------------------------


def test_axis_names_are_the_meshs(mesh):
    assert resolve(mesh, (("r", 2), None)).axis_names == (("r", "m"), None)


def test_axis_names_of_unnamed_mesh_are_generated():
    assert resolve(Mesh(np.arange(8), (2, 4)), (1, None)).axis_names == (("_1",), None)


def test_specs_spelled_apart_are_equal_and_hash_alike(mesh):
    a, b = resolve(mesh, ("m", None)), MeshSpec(mesh, ((2,), None))
    assert a == b and hash(a) == hash(b)


def test_specs_over_other_axes_differ(mesh):
    assert resolve(mesh, ("m", None)) != resolve(mesh, ("b", None))


def test_specs_over_equal_meshes_are_equal(mesh):
    other = Mesh(np.arange(8), (1, 2, 4), ("r", "b", "m"))
    assert resolve(mesh, (0, 1, 2)) == resolve(other, (0, 1, 2))


def test_specs_over_other_meshes_differ(mesh):
    assert resolve(mesh, (0, 1)) != resolve(Mesh(np.arange(8), (2, 4)), (0, 1))


def test_value_is_immutable(mesh):
    with pytest.raises(AttributeError):
        resolve(mesh, (0, None)).axes = ((1,), None)


def test_value_keeps_the_spelling_it_was_given(mesh):
    assert resolve(mesh, ("m", ("r", "b"))).spec == ("m", ("r", "b"))


def test_resolution_is_cached_on_the_mesh(mesh):
    assert resolve(mesh, (0, None)) is resolve(mesh, [0, None])


# -- JAX equivalents -------------------------------------------------------------------


def test_jax_partition_spec_uses_axis_names(mesh):
    assert resolve(mesh, (("r", 2), None)).jax_partition_spec == P(("r", "m"), None)


def test_jax_partition_spec_of_unnamed_mesh_uses_generated_names():
    assert resolve(Mesh(np.arange(8), (2, 4)), (1, 0)).jax_partition_spec == P("_1", "_0")


def test_named_sharding_is_over_the_meshs_jax_mesh(mesh):
    sharding = resolve(mesh, ("b", "m")).named_sharding
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
    assert sharding_type(resolve(Mesh(np.arange(8), shape), spec)) is expected


def test_sharding_type_on_a_one_device_mesh_is_replicated():
    assert sharding_type(resolve(Mesh([3], (1,)), (0,))) is ShardingType.REPLICATED
