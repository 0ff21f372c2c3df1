"""Neural-network lowerings against CPU PyTorch; backward ops get the saved tensors the aten
forward ops produce on CPU, in float64 with tight tolerances."""

import jax
import jax.numpy as jnp
import pytest
import torch

from tests.lowering.helpers import to_jax, to_torch
from tests.lowering.test_linalg import check_lowering, run_lowering  # under jax.jit
from torchspmd.lowering.dtypes import to_jax_dtype
from torchspmd.lowering.registry import LOWERINGS

aten = torch.ops.aten
F64 = dict(atol=1e-10, rtol=1e-10)


def r(*shape, dtype=torch.float64):
    return torch.randn(*shape, dtype=dtype)


# ---------------------------------------------------------------- softmax


@pytest.mark.parametrize("op", [aten._softmax.default, aten._log_softmax.default])
@pytest.mark.parametrize("dim", [0, -1])
def test_softmax_forward(op, dim):
    check_lowering(op, r(3, 5), dim, False, **F64)


def test_softmax_half_to_float():
    check_lowering(aten._softmax.default, r(3, 5, dtype=torch.bfloat16), 1, False, atol=1e-2, rtol=1e-2)
    check_lowering(aten._log_softmax.default, r(3, 5, dtype=torch.bfloat16), 1, False, atol=1e-2, rtol=1e-2)


def test_safe_softmax_fully_masked_rows_are_zero():
    x = r(3, 5)
    x[1] = float("-inf")
    check_lowering(aten._safe_softmax.default, x, -1, **F64)


@pytest.mark.parametrize("fwd,bwd", [(aten._softmax.default, aten._softmax_backward_data.default),
                                     (aten._log_softmax.default, aten._log_softmax_backward_data.default)])
def test_softmax_backward(fwd, bwd):
    out = fwd(r(3, 5), 1, False)
    check_lowering(bwd, r(3, 5), out, 1, torch.float64, **F64)


# ---------------------------------------------------------------- normalization


@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm(affine):
    x, w, b = r(2, 3, 4), (r(3, 4) if affine else None), (r(3, 4) if affine else None)
    check_lowering(aten.native_layer_norm.default, x, [3, 4], w, b, 1e-5, **F64)
    _, mean, rstd = aten.native_layer_norm(x, [3, 4], w, b, 1e-5)
    check_lowering(aten.native_layer_norm_backward.default, r(2, 3, 4), x, [3, 4], mean, rstd, w, b,
                   [True, affine, affine], **F64)


def test_layer_norm_bfloat16_stats_follow_meta():
    x = r(2, 3, 4, dtype=torch.bfloat16)
    out, mean, rstd = run_lowering(aten.native_layer_norm.default, x, [4], None, None, 1e-5)
    assert mean.dtype == rstd.dtype == torch.float32  # the meta kernel's dtype, not CPU's bf16
    torch.testing.assert_close(out, aten.native_layer_norm(x, [4], None, None, 1e-5)[0], atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("affine", [True, False])
def test_group_norm(affine):
    x, w, b = r(2, 6, 3, 3), (r(6) if affine else None), (r(6) if affine else None)
    check_lowering(aten.native_group_norm.default, x, w, b, 2, 6, 9, 3, 1e-5, **F64)
    _, mean, rstd = aten.native_group_norm(x, w, b, 2, 6, 9, 3, 1e-5)
    check_lowering(aten.native_group_norm_backward.default, r(2, 6, 3, 3), x, mean, rstd, w, 2, 6, 9, 3,
                   [True, affine, affine], **F64)


def _bn_args(shape=(4, 3, 5)):
    return r(*shape), r(3), r(3), r(3), torch.rand(3, dtype=torch.float64) + 0.5


@pytest.mark.parametrize("shape", [(4, 3), (4, 3, 5), (2, 3, 4, 4)])
def test_batch_norm_train(shape):
    x, w, b, rm, rv = _bn_args(shape)
    check_lowering(aten.native_batch_norm.default, x, w, b, rm.clone(), rv.clone(), True, 0.1, 1e-5, **F64)


def test_batch_norm_functional_running_stats():
    x, w, b, rm, rv = _bn_args()
    out, mean, invstd = aten.native_batch_norm(x, w, b, rm_new := rm.clone(), rv_new := rv.clone(), True, 0.1, 1e-5)
    got = run_lowering(aten._native_batch_norm_legit_functional.default, x, w, b, rm, rv, True, 0.1, 1e-5)
    for a, e in zip(got, (out, mean, invstd, rm_new, rv_new)):  # aten mutated rm_new/rv_new
        torch.testing.assert_close(a, e, **F64)
    check_lowering(aten._native_batch_norm_legit_functional.default, x, w, b, rm, rv, True, 0.1, 1e-5, **F64)


@pytest.mark.parametrize("op", [aten.native_batch_norm.default, aten._native_batch_norm_legit_no_training.default])
def test_batch_norm_eval(op):
    x, w, b, rm, rv = _bn_args()
    args = (x, w, b, rm, rv, False, 0.1, 1e-5) if op == aten.native_batch_norm.default else (x, w, b, rm, rv, 0.1, 1e-5)
    # CPU returns empty save_mean/invstd in eval, the meta kernel (C,): compare the output only.
    torch.testing.assert_close(run_lowering(op, *args)[0], op(*args)[0], **F64)


def test_batch_norm_no_stats():
    x, w, b, _, _ = _bn_args()
    check_lowering(aten._native_batch_norm_legit.no_stats, x, w, b, True, 0.1, 1e-5, **F64)


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_backward(train, affine):
    x, w, b, rm, rv = _bn_args((2, 3, 4, 4))
    w, b = (w, b) if affine else (None, None)
    _, mean, invstd = aten.native_batch_norm(x, w, b, rm.clone(), rv.clone(), train, 0.1, 1e-5)
    check_lowering(aten.native_batch_norm_backward.default, r(2, 3, 4, 4), x, w, rm, rv, mean, invstd, train, 1e-5,
                   [True, affine, affine], **F64)


# ---------------------------------------------------------------- activations

ACTIVATIONS = {
    "relu": (aten.relu.default, ()),
    "gelu": (aten.gelu.default, ()),
    "gelu_tanh": (aten.gelu.default, (), {"approximate": "tanh"}),
    "silu": (aten.silu.default, ()),
    "mish": (aten.mish.default, ()),
    "hardtanh": (aten.hardtanh.default, (-0.5, 1.5)),
    "leaky_relu": (aten.leaky_relu.default, (0.2,)),
    "elu": (aten.elu.default, (1.5, 1.0507, 0.5)),
    "celu": (aten.celu.default, (0.7,)),
    "softplus": (aten.softplus.default, (2.0, 1.0)),
    "hardswish": (aten.hardswish.default, ()),
    "hardsigmoid": (aten.hardsigmoid.default, ()),
    "prelu": (aten._prelu_kernel.default, "weight"),
}

BACKWARDS = {
    "threshold": (aten.threshold_backward.default, lambda x: (x, 0)),
    "gelu": (aten.gelu_backward.default, lambda x: (x,)),
    "gelu_tanh": (aten.gelu_backward.default, lambda x: (x,), {"approximate": "tanh"}),
    "silu": (aten.silu_backward.default, lambda x: (x,)),
    "tanh": (aten.tanh_backward.default, lambda x: (torch.tanh(x),)),
    "sigmoid": (aten.sigmoid_backward.default, lambda x: (torch.sigmoid(x),)),
    "hardtanh": (aten.hardtanh_backward.default, lambda x: (x, -0.5, 1.5)),
    "leaky_relu": (aten.leaky_relu_backward.default, lambda x: (x, 0.2, False)),
    "elu_input": (aten.elu_backward.default, lambda x: (1.5, 1.0507, 0.5, False, x)),
    "elu_result": (aten.elu_backward.default, lambda x: (1.5, 1.0507, 0.5, True, aten.elu(x, 1.5, 1.0507, 0.5))),
    "softplus": (aten.softplus_backward.default, lambda x: (x, 2.0, 1.0)),
    "log_sigmoid": (aten.log_sigmoid_backward.default, lambda x: (x, aten.log_sigmoid_forward(x)[1])),
    "hardswish": (aten.hardswish_backward.default, lambda x: (x,)),
    "hardsigmoid": (aten.hardsigmoid_backward.default, lambda x: (x,)),
}


def _act_input():
    x = r(4, 6) * 3
    x[0, :4] = torch.tensor([0.0, -3.0, 3.0, 1.5])  # boundaries of the piecewise ones
    return x


@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [torch.float64])
def test_activation(name, dtype):
    op, extra, *kw = ACTIVATIONS[name]
    x = _act_input().to(dtype)
    extra = (torch.rand(1, 6, dtype=dtype),) if extra == "weight" else extra
    check_lowering(op, x, *extra, **(kw[0] if kw else {}), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", BACKWARDS)
def test_activation_backward(name):
    op, make, *kw = BACKWARDS[name]
    x = _act_input()
    check_lowering(op, r(4, 6), *make(x), **(kw[0] if kw else {}), **F64)


@pytest.mark.parametrize("dim", [0, -1])
def test_glu(dim):
    x = r(4, 6)
    check_lowering(aten.glu.default, x, dim, **F64)
    check_lowering(aten.glu_backward.default, r(2, 6) if dim == 0 else r(4, 3), x, dim, **F64)


def test_prelu_backward():
    check_lowering(aten._prelu_kernel_backward.default, r(2, 3, 4), _act_input().reshape(2, 3, 4), r(1, 3, 1), **F64)


def test_log_sigmoid_forward():
    check_lowering(aten.log_sigmoid_forward.default, _act_input(), **F64)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_activation_float32_bfloat16(dtype, tol):
    check_lowering(aten.gelu.default, _act_input().to(dtype), atol=tol, rtol=tol)
    check_lowering(aten.elu.default, _act_input().to(dtype), 1.5, 1.0507, 0.5, atol=tol, rtol=tol)


@pytest.mark.parametrize("op,extra", [(aten.hardtanh.default, (-0.5, 1.5)), (aten.leaky_relu.default, (0.2,)),
                                      (aten.elu.default, (1.5, 1.0507, 0.5)), (aten.softplus.default, (2.0, 1.0))])
def test_scalars_as_traced_arrays(op, extra):
    x = _act_input()
    expected = op(x, *extra)
    meta = jax.ShapeDtypeStruct(tuple(x.shape), to_jax_dtype(x.dtype))
    out = jax.jit(lambda a, s: LOWERINGS[op](meta, a, *s))(to_jax(x), [jnp.asarray(v) for v in extra])
    assert out.dtype == meta.dtype
    torch.testing.assert_close(to_torch(out), expected, **F64)


def test_native_dropout_backward():
    mask = torch.rand(4, 6) > 0.3
    check_lowering(aten.native_dropout_backward.default, r(4, 6), mask, 1 / 0.7, **F64)


# ---------------------------------------------------------------- losses


def _targets(n=6, c=5, ignore=True):
    t = torch.randint(0, c, (n,))
    if ignore:
        t[1] = -100
    return t


@pytest.mark.parametrize("reduction", [0, 1, 2])
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss(reduction, weighted):
    x, t, w = torch.log_softmax(r(6, 5), 1), _targets(), (torch.rand(5, dtype=torch.float64) if weighted else None)
    check_lowering(aten.nll_loss_forward.default, x, t, w, reduction, -100, **F64)
    _, total = aten.nll_loss_forward(x, t, w, reduction, -100)
    g = r(6) if reduction == 0 else r(())
    check_lowering(aten.nll_loss_backward.default, g, x, t, w, reduction, -100, total, **F64)


def test_nll_loss_unbatched_and_ignore_index():
    x = torch.log_softmax(r(5), 0)
    check_lowering(aten.nll_loss_forward.default, x, torch.tensor(2), None, 1, 3, **F64)
    x, t = torch.log_softmax(r(6, 5), 1), torch.tensor([0, 1, 2, 3, 4, 2])
    check_lowering(aten.nll_loss_forward.default, x, t, None, 1, 2, **F64)


@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_nll_loss2d(reduction):
    x, t = torch.log_softmax(r(2, 5, 3, 4), 1), torch.randint(0, 5, (2, 3, 4))
    t[0, 0, 0] = -100
    w = torch.rand(5, dtype=torch.float64)
    check_lowering(aten.nll_loss2d_forward.default, x, t, w, reduction, -100, **F64)
    _, total = aten.nll_loss2d_forward(x, t, w, reduction, -100)
    g = r(2, 3, 4) if reduction == 0 else r(())
    check_lowering(aten.nll_loss2d_backward.default, g, x, t, w, reduction, -100, total, **F64)


LOSSES = {
    "mse": (aten.mse_loss.default, aten.mse_loss_backward.default, ()),
    "smooth_l1": (aten.smooth_l1_loss.default, aten.smooth_l1_loss_backward.default, (0.5,)),
    "smooth_l1_beta0": (aten.smooth_l1_loss.default, aten.smooth_l1_loss_backward.default, (0.0,)),
    "huber": (aten.huber_loss.default, aten.huber_loss_backward.default, (0.7,)),
    "bce": (aten.binary_cross_entropy.default, aten.binary_cross_entropy_backward.default, "weight"),
}


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_loss(name, reduction):
    fwd, bwd, extra = LOSSES[name]
    x, t = (torch.rand(4, 5, dtype=torch.float64), torch.rand(4, 5, dtype=torch.float64)) if name == "bce" \
        else (r(4, 5), r(4, 5))
    if name == "bce":
        w = torch.rand(4, 5, dtype=torch.float64)
        args, bargs = (w, reduction), (w, reduction)
    else:
        args, bargs = (reduction, *extra), (reduction, *extra)
    check_lowering(fwd, x, t, *args, **F64)
    g = r(4, 5) if reduction == 0 else r(())
    check_lowering(bwd, g, x, t, *bargs, **F64)


@pytest.mark.parametrize("pos_weight", [False, True])
@pytest.mark.parametrize("reduction", [0, 1])
def test_bce_with_logits(pos_weight, reduction):
    pw = torch.rand(5, dtype=torch.float64) * 2 if pos_weight else None
    check_lowering(aten.binary_cross_entropy_with_logits.default, r(4, 5) * 5, torch.rand(4, 5, dtype=torch.float64),
                   torch.rand(5, dtype=torch.float64), pw, reduction, **F64)


# ---------------------------------------------------------------- attention (fused CPU kernel)


@pytest.mark.parametrize("mask", [None, "float", "causal"])
def test_sdpa_flash_cpu(mask):
    q, k, v = r(2, 2, 5, 4), r(2, 2, 6, 4), r(2, 2, 6, 4)
    kw = {}
    if mask == "float":
        kw["attn_mask"] = r(2, 1, 5, 6)
    causal = mask == "causal"
    op = aten._scaled_dot_product_flash_attention_for_cpu.default
    check_lowering(op, q, k, v, 0.0, causal, **kw, scale=0.3, **F64)
    out, lse = op(q, k, v, 0.0, causal, **kw, scale=0.3)
    check_lowering(aten._scaled_dot_product_flash_attention_for_cpu_backward.default, r(2, 2, 5, 4), q, k, v, out,
                   lse, 0.0, causal, **kw, scale=0.3, **F64)


# ---------------------------------------------------------------- MultiheadAttention fast path (eval, no grad)


def _mha_params(e=8):
    return r(3 * e, e), r(3 * e), r(e, e), r(e)


def _mask(kind, b=2, h=2, l=5):
    causal = torch.triu(torch.ones(l, l, dtype=torch.bool), 1)
    if kind == "src":
        return causal, 0
    if kind == "padding":
        pad = torch.zeros(b, l, dtype=torch.bool)
        pad[0, -2:] = True
        return torch.zeros(b, l, dtype=torch.float64).masked_fill(pad, float("-inf")), 1
    if kind == "merged":
        return torch.zeros(b, h, l, l, dtype=torch.float64).masked_fill(causal, float("-inf")), 2
    return None, None


@pytest.mark.parametrize("mask,need_weights,average", [(None, True, True), ("src", True, False),
                                                        ("padding", False, True), ("merged", True, True)])
def test_native_multi_head_attention(mask, need_weights, average):
    x = r(2, 5, 8)
    m, mask_type = _mask(mask)
    check_lowering(aten._native_multi_head_attention.default, x, x, x, 8, 2, *_mha_params(), m, need_weights, average,
                   mask_type, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("norm_first,use_gelu,mask", [(False, False, None), (True, True, "merged"),
                                                      (False, True, "padding")])
def test_transformer_encoder_layer_fwd(norm_first, use_gelu, mask):
    m, mask_type = _mask(mask)
    norms = (r(8), r(8), r(8), r(8))
    ffn = (r(16, 8), r(16), r(8, 16), r(8))
    check_lowering(aten._transformer_encoder_layer_fwd.default, r(2, 5, 8), 8, 2, *_mha_params(), use_gelu, norm_first,
                   1e-5, *norms, *ffn, m, mask_type, atol=1e-9, rtol=1e-9)
