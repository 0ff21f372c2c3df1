"""Indexing, gather/scatter, sort/search lowerings against CPU PyTorch."""

import jax
import jax.numpy as jnp
import pytest
import torch

from tests.lowering.helpers import check_lowering
from torchspmd.lowering.registry import LOWERINGS

aten = torch.ops.aten
T = torch.tensor


def r(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    if dtype.is_floating_point:
        return torch.randn(*shape, generator=g).to(dtype)
    return torch.randint(-50, 50, shape, generator=g, dtype=dtype)


def ix(*shape, high, seed=0):
    g = torch.Generator().manual_seed(seed + 7)
    return torch.randint(0, high, shape, generator=g)


x34, i34, b34, x234 = r(3, 4), r(3, 4, dtype=torch.int64), r(3, 4, dtype=torch.bfloat16), r(2, 3, 4)
m34 = x34 > 0
perm = torch.stack([torch.randperm(3, generator=torch.Generator().manual_seed(k)) for k in range(4)], 1)
ties = T([[3.0, 1.0, float("nan"), 1.0, -0.0, 0.0, 3.0, -2.0]])

CASES = {
    # index / _unsafe_index
    "index_first": (aten.index.Tensor, x234, [T([1, 0, 1])]),
    "index_middle": (aten.index.Tensor, x234, [None, T([2, -1])]),
    "index_adjacent": (aten.index.Tensor, x234, [None, T([0, 2]), T([1, 3])]),
    "index_separated": (aten.index.Tensor, x234, [T([[0], [1]]), None, T([1, 3, 0])]),
    "index_int32_bf16": (aten.index.Tensor, b34, [T([2, 0], dtype=torch.int32)]),
    "index_empty": (aten.index.Tensor, i34, [torch.zeros(0, dtype=torch.long)]),
    "unsafe_index": (aten._unsafe_index.Tensor, i34, [T([1]), T([[0, 3]])]),
    "unsafe_masked_index": (aten._unsafe_masked_index.default, x34, T([[True], [False]]), [T([2, 7]), None], -1.0),
    # index_put and friends
    "index_put": (aten.index_put.default, x34, [T([0, 2])], r(2, 4)),
    "index_put_bcast": (aten.index_put.default, i34, [None, T([1, 3])], T(5)),
    "index_put_separated": (aten.index_put.default, x234, [T([0, 1]), None, T([3, 0])], r(2, 3)),
    "index_put_accumulate_dups": (aten.index_put.default, x34, [T([1, 1, 0, 1])], r(4, 4), True),
    "index_put_mask_scalar": (aten.index_put.default, x34, [m34], T(0.5)),
    "index_put_mask_values": (aten.index_put.default, x34, [m34], torch.arange(float(m34.sum()))),
    "index_put_mask_rows": (aten.index_put.default, x34, [T([True, False, True])], r(2, 4)),
    "index_put_mask_after_slice": (aten.index_put.default, x234, [None, T([False, True, True])], r(4)),
    "index_put_mask_accumulate": (aten.index_put.default, i34, [T([True, False, True])], T([1, 2, 3, 4]), True),
    "index_put_mask_none_true": (aten.index_put.default, x34, [torch.zeros(3, 4, dtype=torch.bool)], torch.zeros(0)),
    "unsafe_index_put": (aten._unsafe_index_put.default, x34, [T([2]), T([1])], T(9.0), True),
    "index_put_impl": (aten._index_put_impl.default, b34, [T([0, 1])], r(2, 4, dtype=torch.bfloat16), True, True),
    "unsafe_masked_index_put": (aten._unsafe_masked_index_put_accumulate.default, x34, T([[True], [False]]),
                                [T([[0], [9]]), T([1, 2, 3])], r(2, 3)),
    "put": (aten.put.default, x34, T([0, -1, 5]), T([1.0, 2.0, 3.0])),
    "put_accumulate": (aten.put.default, i34, T([[4, 4], [0, 4]]), T([[1, 2], [3, 4]]), True),
    "take": (aten.take.default, x234, T([[0, -1], [7, 23]])),
    # gather / scatter
    "gather": (aten.gather.default, x34, 1, T([[0, 3], [1, 1]])),
    "gather_neg_dim": (aten.gather.default, i34, -2, T([[2, 0, 1, 1]])),
    "gather_0d": (aten.gather.default, T(3.0), 0, T(0)),
    "scatter_src": (aten.scatter.src, x34, 0, perm[:2], r(3, 4, seed=1)),
    "scatter_value": (aten.scatter.value, i34, 1, T([[0, 2], [3, 1]]), 7),
    "scatter_reduce_add": (aten.scatter.reduce, x34, 0, ix(4, 4, high=3), r(4, 4), {"reduce": "add"}),
    "scatter_reduce_mul": (aten.scatter.reduce, x34, 0, ix(4, 4, high=3), r(4, 4), {"reduce": "multiply"}),
    "scatter_value_reduce": (aten.scatter.value_reduce, x34, 1, ix(3, 5, high=4), 2.0, {"reduce": "multiply"}),
    "scatter_add": (aten.scatter_add.default, x34, 1, ix(3, 6, high=4), r(3, 6)),
    "scatter_add_int": (aten.scatter_add.default, i34, 0, ix(5, 4, high=3), r(5, 4, dtype=torch.int64)),
    "scatter_reduce_mean_int": (aten.scatter_reduce.two, i34, 0, ix(5, 4, high=3), r(5, 4, dtype=torch.int64),
                                "mean"),
    # index_* along a dim
    "index_select": (aten.index_select.default, x234, -1, T([3, 0, 3])),
    "index_select_0d": (aten.index_select.default, T(4.0), 0, T([0])),
    "index_select_0d_index": (aten.index_select.default, i34, 0, T(2)),
    "index_add": (aten.index_add.default, x34, 0, T([2, 0, 2]), r(3, 4, seed=1), {"alpha": 0.5}),
    "index_add_int": (aten.index_add.default, i34, 1, T([3, 3]), r(3, 2, dtype=torch.int64)),
    "index_copy": (aten.index_copy.default, x234, 1, T([2, 0]), r(2, 2, 4, seed=1)),
    "index_fill_scalar": (aten.index_fill.int_Scalar, x34, -1, T([1, 3]), -2.5),
    "index_fill_tensor": (aten.index_fill.int_Tensor, i34, 0, T([0]), T(11)),
    "masked_fill": (aten.masked_fill.Scalar, x34, m34, 3.0),
    "masked_fill_bcast_int": (aten.masked_fill.Scalar, i34, T([True, False, False, True]), -1),
    "masked_fill_tensor_bf16": (aten.masked_fill.Tensor, b34, m34, T(2.0)),
    "masked_scatter": (aten.masked_scatter.default, x34, m34, r(20)),
    "masked_scatter_bcast": (aten.masked_scatter.default, i34, T([True, False, False, True]),
                             r(3, 4, dtype=torch.int64)),
    "masked_scatter_backward": (aten.masked_scatter_backward.default, x34, m34, [4, 5]),
    "embedding": (aten.embedding.default, r(10, 3), T([[1, 9], [0, 1]])),
    "embedding_dense_backward": (aten.embedding_dense_backward.default, r(2, 3, 4), ix(2, 3, high=5), 6, 2, False),
    "embedding_dense_backward_freq": (aten.embedding_dense_backward.default, r(7, 4), ix(7, high=5), 5, -1, True),
    "repeat_interleave": (aten.repeat_interleave.Tensor, T([2, 0, 3]), {"output_size": 5}),
    # sorting and searching
    "sort": (aten.sort.default, x234, 1),
    "sort_desc_int": (aten.sort.default, i34, -1, True),
    "sort_bool": (aten.sort.stable, m34, {"stable": True, "dim": 1}),
    "sort_stable_ties": (aten.sort.stable, ties, {"stable": True}),
    "sort_stable_ties_desc": (aten.sort.stable, ties, {"stable": True, "descending": True}),
    "sort_0d": (aten.sort.default, T(1.0)),
    "topk": (aten.topk.default, x234, 2),
    "topk_smallest_dim0": (aten.topk.default, i34, 2, 0, False),
    "kthvalue": (aten.kthvalue.default, x234, 2, 1),
    "kthvalue_keepdim": (aten.kthvalue.default, x34, 3, -1, True),
    "searchsorted": (aten.searchsorted.Tensor, T([1.0, 2.0, 2.0, 5.0]), T([[0.0, 2.0], [3.0, 9.0]])),
    "searchsorted_right": (aten.searchsorted.Tensor, T([1, 2, 2, 5]), T([2, 5, 6]), {"right": True}),
    "searchsorted_side_int32": (aten.searchsorted.Tensor, T([1, 2, 2, 5]), T([2]),
                                {"side": "right", "out_int32": True}),
    "searchsorted_nd": (aten.searchsorted.Tensor, T([[1.0, 3.0], [0.0, 5.0]]), T([[2.0, 4.0, 0.0], [6.0, 1.0, 0.0]])),
    "searchsorted_sorter": (aten.searchsorted.Tensor, T([5.0, 1.0, 3.0]), T([2.0, 4.0]), {"sorter": T([1, 2, 0])}),
    "searchsorted_scalar": (aten.searchsorted.Scalar, T([1.0, 2.0, 5.0]), 2.0),
    "bucketize": (aten.bucketize.Tensor, x34, T([-1.0, 0.0, 1.0])),
    "bucketize_right": (aten.bucketize.Tensor, T([[0, 1], [5, 2]]), T([0, 2, 4]), {"right": True}),
    "bucketize_scalar": (aten.bucketize.Scalar, 3, T([1, 3, 5])),
}

REDUCES = ["sum", "prod", "mean", "amax", "amin"]


def _call(case):
    op, *args = case
    kwargs = args.pop() if args and isinstance(args[-1], dict) else {}
    return op, args, kwargs


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_matches_torch(case):
    op, args, kwargs = _call(case)
    check_lowering(op, *args, **kwargs)


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", REDUCES)
def test_scatter_reduce(reduce, include_self):
    check_lowering(aten.scatter_reduce.two, x34, 1, ix(3, 6, high=4), r(3, 6, seed=2), reduce,
                   include_self=include_self)


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
def test_index_reduce(reduce, include_self):
    check_lowering(aten.index_reduce.default, x34, 0, T([2, 0, 2, 2]), r(4, 4, seed=3), reduce,
                   include_self=include_self)


def test_bool_mask_index_raises():
    meta = jax.ShapeDtypeStruct((2,), jnp.float32)
    with pytest.raises(NotImplementedError, match="data-dependent"):
        LOWERINGS[aten.index.Tensor](meta, jnp.zeros(3), [jnp.array([True, False, True])])


@pytest.mark.parametrize("op", [aten.nonzero.default, aten.masked_select.default, aten._unique2.default])
def test_data_dependent_ops_are_not_lowered(op):
    assert op not in LOWERINGS


@pytest.mark.parametrize("op,args", [
    (aten.masked_fill.Scalar, lambda v: (jnp.ones((2, 2)), jnp.eye(2, dtype=bool), v)),
    (aten.index_fill.int_Scalar, lambda v: (jnp.ones((2, 2)), 1, jnp.array([0]), v)),
    (aten.scatter.value, lambda v: (jnp.ones((2, 2)), 1, jnp.array([[1], [0]]), v)),
])
def test_scalar_may_be_a_traced_array(op, args):
    meta = jax.ShapeDtypeStruct((2, 2), jnp.float32)
    out = jax.jit(lambda v: LOWERINGS[op](meta, *args(v)))(jnp.asarray(7.0))
    assert out.dtype == jnp.float32 and float(out.max()) == 7.0
