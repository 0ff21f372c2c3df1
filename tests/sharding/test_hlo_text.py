"""Sharding strings: from specs (spec §2 worked examples), from JAX shardings, parsing."""

import numpy as np
import pytest

import torchspmd.jax_setup  # noqa: F401
import jax
from jax._src.lib import xla_client
from jax._src.sharding_impls import GSPMDSharding
from jax.sharding import SingleDeviceSharding

from torchspmd.sharding.hlo_text import (
    ParsedSharding,
    ShardingType,
    format_tiled,
    parse_hlo_text,
    sharding_to_hlo_text,
    spec_to_hlo_text,
    v2_to_v1,
)
from torchspmd.sharding.mesh import Mesh
from torchspmd.sharding.partition_spec import named_sharding, resolve


def ids_text(ids) -> str:
    return ",".join(str(i) for i in np.asarray(ids).reshape(-1))


ALL = ids_text(range(8))
REP = " last_tile_dim_replicate"
RBM = dict(shape=(1, 2, 4), names=("r", "b", "m"))
RBM_LOGICAL = np.arange(8).reshape(1, 2, 4)
FSDP = ("data", "fsdp", "tensor")


def example(name, ids, shape, names, ndim, spec, expected):
    return pytest.param(list(ids), shape, names, ndim, spec, expected, id=name)


# Spec §2's worked examples and edge cases (N=8 unless the name says otherwise; smaller
# N are sub-meshes of the first N devices), then sub-mesh cases.
WORKED_EXAMPLES = [
    example("mark_sharding_2d", range(8), (1, 8), None, 2, (0, 1), f"{{devices=[1,8]{ALL}}}"),
    example("custom_tile_assignment", range(7, -1, -1), (1, 8), None, 2, (0, 1),
            "{devices=[1,8]7,6,5,4,3,2,1,0}"),
    example("tupled_partition_spec", range(8), (2, 4), None, 1, ((0, 1),),
            f"{{devices=[8]{ALL}}}"),
    example("named_partial_tupled_rb", range(8), RBM["shape"], RBM["names"], 2,
            (("r", "b"), None), f"{{devices=[2,1,4]{ALL}{REP}}}"),
    example("named_partial_tupled_bm", range(8), RBM["shape"], RBM["names"], 2,
            (None, ("b", "m")), f"{{devices=[1,8]{ALL}}}"),
    example("named_partial_tupled_rm", range(8), RBM["shape"], RBM["names"], 2,
            (None, ("r", "m")),
            f"{{devices=[1,4,2]{ids_text(RBM_LOGICAL.transpose((0, 2, 1)))}{REP}}}"),
    example("named_partial_tupled_mb", range(8), RBM["shape"], RBM["names"], 2,
            (None, ("m", "b")), f"{{devices=[1,8]{ids_text(RBM_LOGICAL.transpose((2, 1, 0)))}}}"),
    example("multiple_tuples", range(8), (1, 2, 4, 1), ("a", "b", "c", "d"), 2,
            (("a", "b"), ("c", "d")), f"{{devices=[2,4]{ALL}}}"),
    example("3d_tensor_2d_mesh", range(8), (2, 4), None, 3, (None, 0, 1),
            f"{{devices=[1,2,4]{ALL}}}"),
    example("mark_sharding_partial", range(8), (2, 4), None, 2, (0, None),
            f"{{devices=[2,1,4]{ALL}{REP}}}"),
    example("partial_unordered", range(8), (2, 1, 4), None, 3, (1, None, 0),
            f"{{devices=[1,1,2,4]{ALL}{REP}}}"),
    example("2d_tensor_3d_mesh", range(8), (2, 4, 1), None, 2, (2, 1),
            f"{{devices=[1,4,2]0,4,1,5,2,6,3,7{REP}}}"),
    example("2d_tensor_3d_mesh_n2", range(2), (2, 1, 1), None, 2, (2, 1), "{replicated}"),
    example("partially_replicated_xla_shards", range(8), (4, 2), None, 2, (None, 1),
            f"{{devices=[1,2,4]0,2,4,6,1,3,5,7{REP}}}"),
    example("fsdp_v2_multi_slice", range(8), (2, 4, 1), FSDP, 2, (None, "fsdp"),
            f"{{devices=[1,4,2]0,4,1,5,2,6,3,7{REP}}}"),
    example("fsdp_v2_multi_slice_n4", range(4), (2, 2, 1), FSDP, 2, (None, "fsdp"),
            f"{{devices=[1,2,2]0,2,1,3{REP}}}"),
    example("mark_shard_scalar", range(8), (2, 4), None, 0, (), "{replicated}"),
    example("edge_replicated_after_normalization", range(8), (1, 8), None, 2, (0, None),
            "{replicated}"),
    example("edge_size_one_leftover_axis_is_tiled", range(8), (2, 4, 1), None, 2, (0, 1),
            f"{{devices=[2,4]{ALL}}}"),
    example("sub_mesh_real_ids", [2, 3], (1, 2), ("x", "y"), 2, ("x", "y"), "{devices=[1,2]2,3}"),
    example("sub_mesh_partial_real_ids", [5, 1, 7, 3], (2, 2), None, 2, (None, 1),
            f"{{devices=[1,2,2]5,7,1,3{REP}}}"),
    example("one_device_mesh", [4], (1,), None, 1, (0,), "{replicated}"),
]
EXAMPLE_ARGS = "ids, shape, names, ndim, spec, expected"


@pytest.mark.parametrize(EXAMPLE_ARGS, WORKED_EXAMPLES)
def test_spec_to_hlo_text_matches_pytorch_xla(ids, shape, names, ndim, spec, expected):
    assert spec_to_hlo_text(resolve(Mesh(ids, shape, names), spec, ndim)) == expected


@pytest.mark.parametrize(EXAMPLE_ARGS, WORKED_EXAMPLES)
def test_sharding_to_hlo_text_of_the_named_sharding_matches(ids, shape, names, ndim, spec, expected):
    mesh = Mesh(ids, shape, names)
    assert sharding_to_hlo_text(named_sharding(mesh, spec), ndim) == expected


def test_single_device_sharding_is_replicated():
    assert sharding_to_hlo_text(SingleDeviceSharding(jax.devices()[3]), 2) == "{replicated}"


def test_fully_replicated_sharding_is_replicated():
    mesh = Mesh(np.arange(8), (2, 4), ("x", "y"))
    assert sharding_to_hlo_text(named_sharding(mesh, (None, None)), 2) == "{replicated}"


def test_sharding_of_a_computed_array_is_reported_with_real_ids():
    mesh = Mesh([7, 6, 5, 4], (4,), ("x",))
    x = jax.device_put(np.ones((8, 4)), named_sharding(mesh, ("x", None)))
    y = jax.jit(lambda a: a * 2)(x)
    assert sharding_to_hlo_text(y.sharding, 2) == "{devices=[4,1]7,6,5,4}"


def test_compiler_chosen_output_sharding_is_reported():
    mesh = Mesh(np.arange(8), (2, 4), ("x", "y"))
    x = jax.device_put(np.ones((8, 8)), named_sharding(mesh, ("x", "y")))
    compiled = jax.jit(lambda a: a + 1).lower(x).compile()
    assert sharding_to_hlo_text(compiled.output_shardings, 2) == f"{{devices=[2,4]{ALL}}}"


def _gspmd(text, devices):
    return GSPMDSharding(tuple(devices), xla_client.HloSharding.from_string(text))


def test_gspmd_sharding_positions_map_to_real_ids():
    sharding = _gspmd(f"{{devices=[2,4]{ALL}}}", jax.devices()[::-1])
    assert sharding_to_hlo_text(sharding, 2) == "{devices=[2,4]7,6,5,4,3,2,1,0}"


def test_manual_subgroup_sharding_is_printed_in_subgroup_form():
    sharding = _gspmd(f"{{devices=[2,1,4]{ALL} last_tile_dims={{manual}}}}", jax.devices())
    assert sharding_to_hlo_text(sharding, 2) == f"{{devices=[2,1,4]{ALL} last_tile_dims={{manual}}}}"


def test_manual_sharding_is_manual():
    assert sharding_to_hlo_text(_gspmd("{manual}", jax.devices()), 2) == "{manual}"


def test_maximal_sharding_names_the_real_device():
    assert sharding_to_hlo_text(_gspmd("{maximal device=1}", jax.devices()[::-1]), 2) == "{maximal device=6}"


def test_format_tiled_drops_a_size_one_replication_dim():
    assert format_tiled([2, 4, 1], range(8), replicate_last=True) == f"{{devices=[2,4]{ALL}}}"


def test_format_tiled_collapses_all_one_tiles_to_replicated():
    assert format_tiled([1, 1, 8], range(8), replicate_last=True) == "{replicated}"


def test_format_tiled_prints_subgroup_types():
    text = format_tiled([2, 1, 2, 2], range(8), subgroup_types=["manual", "replicated"])
    assert text == f"{{devices=[2,1,2,2]{ALL} last_tile_dims={{manual, replicated}}}}"


def test_format_tiled_rejects_a_wrong_device_count():
    with pytest.raises(ValueError):
        format_tiled([2, 4], range(4))


@pytest.mark.parametrize(
    "text, kind",
    [
        ("{replicated}", ShardingType.REPLICATED),
        ("{manual}", ShardingType.MANUAL),
        ("{unknown}", ShardingType.UNKNOWN),
        ("{maximal device=3}", ShardingType.MAXIMAL),
        (f"{{devices=[1,8]{ALL}}}", ShardingType.TILED),
        (f"{{devices=[2,1,4]{ALL} last_tile_dim_replicate}}", ShardingType.PARTIAL),
        (f"{{devices=[2,1,4]{ALL} last_tile_dims={{manual}}}}", ShardingType.TILED),
    ],
)
def test_parse_reports_pytorch_xla_sharding_type(text, kind):
    assert parse_hlo_text(text).kind is kind


def test_parse_v1_tiled():
    assert parse_hlo_text("{devices=[1,2]2,3}") == ParsedSharding(ShardingType.TILED, (1, 2), (2, 3), False)


def test_parse_v1_partial():
    parsed = parse_hlo_text("{devices=[1,2,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}")
    assert parsed.tile_dims == (1, 2, 4) and parsed.replicate_last
    assert parsed.device_ids == (0, 2, 4, 6, 1, 3, 5, 7)
    assert (parsed.data_tile_dims, parsed.replication) == ((1, 2), 4)


def test_parse_v2_iota():
    assert parse_hlo_text("{devices=[1,8]<=[8]}").device_ids == tuple(range(8))


def test_parse_v2_transposed_iota():
    parsed = parse_hlo_text("{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}")
    assert parsed.device_ids == (0, 4, 1, 5, 2, 6, 3, 7) and parsed.kind is ShardingType.PARTIAL


def test_parse_subgroup_types():
    parsed = parse_hlo_text(f"{{devices=[2,1,2,2]{ALL} last_tile_dims={{manual, replicated}}}}")
    assert parsed.subgroup_types == ("manual", "replicated") and parsed.data_tile_dims == (2, 1)


def test_parse_replicated_subgroup_is_partial():
    parsed = parse_hlo_text(f"{{devices=[2,1,4]{ALL} last_tile_dims={{replicated}}}}")
    assert parsed.kind is ShardingType.PARTIAL and parsed.replicate_last


def test_parse_maximal_keeps_the_device():
    assert parse_hlo_text("{maximal device=3}").device_ids == (3,)


@pytest.mark.parametrize("text", ["", "{devices=[2]0}", "{tiled}", "devices=[2]0,1", "{devices=[2]0,1 bogus}"])
def test_parse_rejects_malformed_strings(text):
    with pytest.raises(ValueError):
        parse_hlo_text(text)


def test_partial_parsed_sharding_defaults_its_subgroup_type():
    assert ParsedSharding(ShardingType.PARTIAL, (2, 4), tuple(range(8)), True).data_tile_dims == (2,)


@pytest.mark.parametrize(
    "v2, v1",
    [
        ("{devices=[1,8]<=[8]}", f"{{devices=[1,8]{ALL}}}"),
        (f"{{devices=[1,4,2]<=[2,4]T(1,0){REP}}}", f"{{devices=[1,4,2]0,4,1,5,2,6,3,7{REP}}}"),
        ("{devices=[2,4]<=[2,2,2]T(2,1,0)}", "{devices=[2,4]0,4,2,6,1,5,3,7}"),
        ("{replicated}", "{replicated}"),
        ("{devices=[2]1,0}", "{devices=[2]1,0}"),
    ],
)
def test_v2_to_v1(v2, v1):
    assert v2_to_v1(v2) == v1


@pytest.mark.parametrize(
    "v2",
    ["{devices=[2,4]<=[2,2,2]T(2,1,0)}", "{devices=[4,2]<=[8]}", f"{{devices=[1,2,4]<=[4,2]T(1,0){REP}}}"],
)
def test_v2_to_v1_agrees_with_xla(v2):
    hlo = xla_client.HloSharding.from_string(v2)
    assert parse_hlo_text(v2_to_v1(v2)).device_ids == tuple(hlo.tile_assignment_devices())


def test_sharding_type_values_match_pytorch_xla():
    assert [(t.name, t.value) for t in ShardingType] == [
        ("REPLICATED", 0), ("MAXIMAL", 1), ("TUPLE", 2), ("TILED", 3),
        ("MANUAL", 4), ("PARTIAL", 5), ("UNKNOWN", 6),
    ]
