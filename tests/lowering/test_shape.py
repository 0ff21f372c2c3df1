"""Shape / view lowerings against CPU PyTorch."""

import pytest
import torch

from tests.lowering.helpers import check_lowering, run_lowering

aten = torch.ops.aten


def r(*shape, dtype=torch.float32):
    g = torch.Generator().manual_seed(sum(shape) + len(shape))
    if dtype.is_floating_point:
        return torch.randn(*shape, generator=g).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    return torch.randint(-50, 50, shape, generator=g, dtype=dtype)


x34, i34, b34 = r(3, 4), r(3, 4, dtype=torch.int64), r(3, 4, dtype=torch.bfloat16)
x234 = r(2, 3, 4)
s0 = torch.tensor(2.5)

CASES = {
    # reshapes, aliases
    "view": (aten.view.default, x234, [6, -1]),
    "view_int": (aten.view.default, i34, [12]),
    "view_0d": (aten.view.default, s0, [1, 1]),
    "_unsafe_view": (aten._unsafe_view.default, x234, [4, 6]),
    "_reshape_alias": (aten._reshape_alias.default, x234, [6, 4], [4, 1]),
    "view_copy": (aten.view_copy.default, b34, [2, 6]),
    "squeeze": (aten.squeeze.default, r(1, 3, 1, 2)),
    "squeeze_dim": (aten.squeeze.dim, r(1, 3, 1, 2), -2),
    "squeeze_dims": (aten.squeeze.dims, r(1, 3, 1, 2), [0, 2]),
    "squeeze_0d": (aten.squeeze.dim, s0, 0),
    "unsqueeze": (aten.unsqueeze.default, i34, -1),
    "unsqueeze_0d": (aten.unsqueeze.default, s0, 0),
    "alias": (aten.alias.default, x34),
    "detach": (aten.detach.default, b34),
    "expand": (aten.expand.default, r(3, 1), [2, 3, 4]),
    "expand_neg1": (aten.expand.default, r(3, 1), [-1, 5]),
    "expand_copy": (aten.expand_copy.default, s0, [2, 2]),
    "view_dtype_same": (aten.view.dtype, x34, torch.int32),
    "view_dtype_smaller": (aten.view.dtype, x34, torch.bfloat16),
    "view_dtype_larger": (aten.view.dtype, x34, torch.float64),
    "permute": (aten.permute.default, x234, [2, 0, 1]),
    "permute_neg": (aten.permute.default, x234, [-1, -3, -2]),
    "transpose": (aten.transpose.int, x234, 0, -1),
    "transpose_1d": (aten.transpose.int, r(5), 0, -1),
    "t": (aten.t.default, i34),
    "t_1d": (aten.t.default, r(5)),
    "view_as_real": (aten.view_as_real.default, torch.randn(3, 2, dtype=torch.complex64)),
    "view_as_complex": (aten.view_as_complex.default, r(3, 2)),
    # joining, splitting
    "cat": (aten.cat.default, [x34, r(2, 4)]),
    "cat_neg": (aten.cat.default, [x34, r(3, 1)], -1),
    "cat_promote": (aten.cat.default, [x34, i34], 1),
    "cat_legacy_empty": (aten.cat.default, [x34, torch.zeros(0)], 0),
    "stack": (aten.stack.default, [x34, x34], 1),
    "stack_neg": (aten.stack.default, [i34, i34, i34], -1),
    "block_diag": (aten.block_diag.default, [r(2, 3), r(4), s0]),
    "split": (aten.split.Tensor, r(7, 2), 3),
    "split_neg": (aten.split.Tensor, i34, 2, -1),
    "split_with_sizes": (aten.split_with_sizes.default, x234, [1, 0, 3], 2),
    "unsafe_split": (aten.unsafe_split.Tensor, r(5), 2),
    "unbind": (aten.unbind.int, x234, 1),
    "unbind_neg": (aten.unbind.int, i34, -1),
    # selecting
    "select": (aten.select.int, x234, 1, 2),
    "select_neg": (aten.select.int, x234, -1, -1),
    "slice": (aten.slice.Tensor, r(10, 3), 0, 2, 9, 3),
    "slice_none": (aten.slice.Tensor, r(10, 3), 1, None, None),
    "slice_neg": (aten.slice.Tensor, r(10, 3), 0, -4, -1),
    "slice_clamp": (aten.slice.Tensor, r(10, 3), 0, -100, 2**62, 2),
    "slice_empty": (aten.slice.Tensor, r(10, 3), 0, 7, 3),
    "slice_int": (aten.slice.Tensor, i34, -1, 1, 3),
    "narrow_copy": (aten.narrow_copy.default, x34, 1, -3, 2),
    "diagonal": (aten.diagonal.default, x234, 1, 0, 2),
    "diagonal_neg": (aten.diagonal.default, x234, -1, -1, -2),
    "diagonal_copy": (aten.diagonal_copy.default, i34),
    "as_strided": (aten.as_strided.default, r(12), [3, 2], [1, 3], 1),
    "as_strided_overlap": (aten.as_strided.default, r(3, 4), [4, 3], [2, 1]),
    "unfold": (aten.unfold.default, x234, 2, 2, 1),
    "unfold_step": (aten.unfold.default, r(9, 2), 0, 3, 2),
    "unfold_0d": (aten.unfold.default, s0, 0, 1, 1),
    # rearranging
    "flip": (aten.flip.default, x234, [0, -1]),
    "flip_int": (aten.flip.default, i34, [1]),
    "roll": (aten.roll.default, x234, [1, -2], [0, 2]),
    "roll_flat": (aten.roll.default, i34, [5]),
    "rot90": (aten.rot90.default, x234, 1, [1, 2]),
    "rot90_neg": (aten.rot90.default, x34, -1, [1, 0]),
    "repeat": (aten.repeat.default, x34, [2, 1, 3]),
    "repeat_0d": (aten.repeat.default, s0, [3]),
    "tril": (aten.tril.default, x234, -1),
    "triu": (aten.triu.default, i34, 1),
    "triu_bool": (aten.triu.default, b34 > 0),
    "pad": (aten.constant_pad_nd.default, x234, [1, 2, 0, 1], 3.5),
    "pad_crop": (aten.constant_pad_nd.default, x234, [-1, 2, 1, -1]),
    "pad_int": (aten.constant_pad_nd.default, i34, [2, 2], 7),
    "pad_bf16": (aten.constant_pad_nd.default, b34, [1, 1], -1.5),
    "diag_embed": (aten.diag_embed.default, r(2, 3)),
    "diag_embed_offset": (aten.diag_embed.default, r(2, 3), -1, 0, 2),
    "diag_embed_swap": (aten.diag_embed.default, r(2, 3), 2, -1, 0),
    # scatter inverses, backward ops
    "slice_scatter": (aten.slice_scatter.default, r(10, 3), r(3, 3), 0, 1, 9, 3),
    "slice_scatter_neg": (aten.slice_scatter.default, i34, i34[:, 1:3], -1, -3, -1),
    "slice_scatter_none": (aten.slice_scatter.default, x34, x34 * 2, 0),
    "select_scatter": (aten.select_scatter.default, x234, r(2, 4), 1, -1),
    "diagonal_scatter": (aten.diagonal_scatter.default, x234, r(4, 2), 0, 0, 1),
    "diagonal_scatter_off": (aten.diagonal_scatter.default, x234, r(2, 3), -1, 2, 1),
    "as_strided_scatter": (aten.as_strided_scatter.default, r(3, 4), r(2, 3), [2, 3], [4, 2], 1),
    "select_backward": (aten.select_backward.default, r(3, 4), [3, 5, 4], 1, -2),
    "slice_backward": (aten.slice_backward.default, r(3, 4), [9, 4], 0, 1, 2**62, 3),
    "diagonal_backward": (aten.diagonal_backward.default, r(2, 3), [2, 4, 3], 0, 2, 1),
    "unfold_backward": (aten.unfold_backward.default, r(2, 4, 4, 3), [2, 9, 4], 1, 3, 2),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_matches_torch(case):
    op, *args = case
    check_lowering(op, *args)


@pytest.mark.parametrize("op", [aten.split.Tensor, aten.unbind.int])
def test_multi_output_is_a_list_of_meta_length(op):
    args = (r(5, 2), 2) if op is aten.split.Tensor else (r(5, 2),)
    out = run_lowering(op, *args)
    assert isinstance(out, list) and len(out) == len(op(*args))


def test_copy_variants_share_the_view_lowering():
    from torchspmd.lowering.registry import LOWERINGS
    assert LOWERINGS[aten.permute_copy.default] is LOWERINGS[aten.permute.default]
    assert LOWERINGS[aten.slice_copy.Tensor] is LOWERINGS[aten.slice.Tensor]
