"""Per-device shard geometry (spec §1.8, §4.6)."""

import numpy as np
import pytest

import torchspmd.jax_setup  # noqa: F401

from torchspmd.sharding.hlo_text import parse_hlo_text, spec_to_hlo_text
from torchspmd.sharding.layout import ShardInfo, pad_shard, shard_indices, shard_layout
from torchspmd.sharding.mesh import Mesh
from torchspmd.sharding.partition_spec import named_sharding, resolve

TILED_9 = "{devices=[8]0,1,2,3,4,5,6,7}"
PARTIAL_4x2 = "{devices=[1,2,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"


def by_device(layout):
    return {s.device_id: s for s in layout}


def test_uneven_1d_shards_all_have_the_padded_length():
    assert {s.padded_shape for s in shard_layout(TILED_9, (9,))} == {(2,)}


def test_uneven_1d_last_full_device_holds_the_remainder():
    assert by_device(shard_layout(TILED_9, (9,)))[4].indices == [slice(8, 9, 1)]


@pytest.mark.parametrize("device", [5, 6, 7])
def test_uneven_1d_trailing_devices_hold_empty_slices(device):
    assert by_device(shard_layout(TILED_9, (9,)))[device].indices == [slice(9, 9, 1)]


def test_uneven_2d_shards_are_all_2x2():
    text = spec_to_hlo_text(resolve(Mesh(np.arange(8), (2, 4)), (0, 1), 2))
    assert {s.padded_shape for s in shard_layout(text, (3, 5))} == {(2, 2)}


def test_uneven_2d_device_3_holds_an_empty_column_range():
    text = spec_to_hlo_text(resolve(Mesh(np.arange(8), (2, 4)), (0, 1), 2))
    assert by_device(shard_layout(text, (3, 5)))[3].indices == [slice(0, 2, 1), slice(5, 5, 1)]


def test_unpadded_shape_is_the_real_data_shape():
    assert by_device(shard_layout(TILED_9, (9,)))[4].unpadded_shape == (1,)


def test_tiled_shards_have_replica_id_zero():
    assert {s.replica_id for s in shard_layout(TILED_9, (9,))} == {0}


def test_partially_replicated_replica_id_is_device_over_two():
    text = spec_to_hlo_text(resolve(Mesh(np.arange(8), (4, 2)), (None, 1), 2))
    assert text == PARTIAL_4x2
    assert [s.replica_id for s in shard_layout(text, (16, 16))] == [i // 2 for i in range(8)]


def test_partially_replicated_shards_split_the_columns():
    layout = by_device(shard_layout(PARTIAL_4x2, (16, 16)))
    assert layout[2].indices == [slice(0, 16, 1), slice(0, 8, 1)]
    assert layout[3].indices == [slice(0, 16, 1), slice(8, 16, 1)]


def test_default_order_is_increasing_device_id():
    layout = shard_layout("{devices=[1,8]7,6,5,4,3,2,1,0}", (1, 8))
    assert [s.device_id for s in layout] == list(range(8))


def test_device_order_follows_the_given_mesh_order():
    mesh = Mesh([3, 1, 2, 0], (4,))
    layout = shard_layout(spec_to_hlo_text(resolve(mesh, (0,), 1)), (8,), device_order=mesh.device_ids)
    assert [(s.device_id, s.indices[0].start) for s in layout] == [(3, 0), (1, 2), (2, 4), (0, 6)]


def test_device_order_must_be_the_shardings_device_set():
    with pytest.raises(ValueError):
        shard_layout("{devices=[2]2,3}", (4,), device_order=[0, 1])


def test_replicated_covers_every_device_with_its_ordinal_as_replica():
    layout = shard_layout("{replicated}", (4, 2))
    assert [(s.device_id, s.replica_id, s.indices) for s in layout] == [(i, i, Ellipsis) for i in range(8)]


def test_replicated_padded_shape_is_the_global_shape():
    assert shard_layout("{replicated}", (4, 2))[0].padded_shape == (4, 2)


def test_replicated_on_a_sub_mesh_covers_its_devices():
    layout = shard_layout("{replicated}", (4,), device_order=[2, 3])
    assert [(s.device_id, s.replica_id) for s in layout] == [(2, 0), (3, 1)]


def test_unannotated_is_replicated():
    assert len(shard_layout("", (3,))) == 8


def test_maximal_is_one_whole_shard():
    assert shard_layout("{maximal device=5}", (3,)) == [ShardInfo(5, Ellipsis, (3,), 0)]


def test_manual_has_no_layout():
    with pytest.raises(ValueError):
        shard_layout("{manual}", (3,))


def test_rank_mismatch_is_an_error():
    with pytest.raises(ValueError):
        shard_layout("{devices=[2,4]0,1,2,3,4,5,6,7}", (8,))


def test_parsed_sharding_is_accepted():
    assert shard_layout(parse_hlo_text(TILED_9), (9,)) == shard_layout(TILED_9, (9,))


def test_v2_string_is_accepted():
    assert shard_layout("{devices=[8]<=[8]}", (9,)) == shard_layout(TILED_9, (9,))


@pytest.mark.parametrize(
    "shape, spec", [((2, 4), (0, 1)), ((4, 2), (None, 1)), ((1, 2, 4), (("r", "m"), None))]
)
def test_indices_agree_with_jax_on_even_shapes(shape, spec):
    names = ("r", "b", "m")[: len(shape)]
    mesh = Mesh(np.arange(8)[::-1], shape, names)
    spec = tuple(names[e] if type(e) is int else e for e in spec)
    jax_map = named_sharding(mesh, spec).devices_indices_map((16, 8))
    # JAX writes an unsplit dim as slice(None) and no steps; spell both out to compare.
    expected = {d.id: [slice(*s.indices(n)) for s, n in zip(idx, (16, 8))] for d, idx in jax_map.items()}
    for shard in shard_layout(spec_to_hlo_text(resolve(mesh, spec, 2)), (16, 8)):
        assert shard.indices == expected[shard.device_id]


def test_shard_indices_clamp_to_the_shape():
    assert shard_indices((1, 3), (2, 4), (3, 5)) == [slice(2, 3, 1), slice(5, 5, 1)]


def test_pad_shard_zero_pads_on_the_right():
    assert pad_shard(np.array([[1], [2]]), (2, 3)).tolist() == [[1, 0, 0], [2, 0, 0]]


def test_pad_shard_of_an_empty_shard_is_zeros():
    assert pad_shard(np.zeros((0,), dtype=np.int64), (2,)).tolist() == [0, 0]


def test_pad_shard_keeps_the_dtype():
    assert pad_shard(np.ones(1, dtype=np.float16), (2,)).dtype == np.float16


def test_pad_shard_rejects_a_smaller_target():
    with pytest.raises(ValueError):
        pad_shard(np.ones(3), (2,))
