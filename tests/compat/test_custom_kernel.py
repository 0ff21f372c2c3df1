"""``torch_xla.experimental.custom_kernel`` and ``torch_xla.core.xla_builder.call_jax`` as
torchspmd serves them: the Pallas kernels' math, compared with a CPU PyTorch reference
written from the kernels' own reference (``mha_reference``: logits ``(q k^T + ab) *
sm_scale``, masked by adding ``-0.7 * float32 max``), values and every gradient.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torchspmd as xs
from torchspmd.compat.torch_xla.core import xla_builder
from torchspmd.compat.torch_xla.experimental import custom_kernel as ck

DEV = xs.device()
B, H, SQ, SK, D = 2, 2, 8, 8, 4


def _reference(q, k, v, causal=False, q_seg=None, kv_seg=None, sm_scale=1.0, ab=None):
    """PyTorch/XLA's flash attention, written out on CPU."""
    logits = q @ k.transpose(-1, -2)
    if ab is not None:
        logits = logits + ab
    logits = logits * sm_scale
    allowed = torch.ones(logits.shape[-2:], dtype=torch.bool)
    if causal:
        allowed = allowed.tril()
    if q_seg is not None:
        allowed = allowed & (q_seg[:, :, None] == kv_seg[:, None, :])[:, None]
    logits = logits + torch.where(allowed, 0.0, ck.DEFAULT_MASK_VALUE)
    return torch.softmax(logits, -1) @ v


def _inputs(seed=0, sq=SQ, sk=SK, with_ab=False):
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, H, sq, D), (B, H, sk, D), (B, H, sk, D)] + ([(B, H, sq, sk)] if with_ab else [])
    return [torch.randn(s, generator=g, requires_grad=True) for s in shapes]


def _on_device(tensors):
    return [t.detach().to(DEV).requires_grad_(True) for t in tensors]


def _check(cpu_inputs, dev_inputs, expected, actual):
    """Output and the gradient of every input equal CPU's, for a random output gradient."""
    torch.testing.assert_close(actual.cpu(), expected.detach(), atol=1e-5, rtol=1e-5)
    cotangent = torch.randn(expected.shape, generator=torch.Generator().manual_seed(9))
    expected.backward(cotangent)
    actual.backward(cotangent.to(DEV))
    for c, d in zip(cpu_inputs, dev_inputs):
        torch.testing.assert_close(d.grad.cpu(), c.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sm_scale", [1.0, 0.5])
def test_flash_attention_matches_the_kernels_math(causal, sm_scale):
    cpu = _inputs()
    dev = _on_device(cpu)
    _check(cpu, dev, _reference(*cpu, causal=causal, sm_scale=sm_scale),
           ck.flash_attention(*dev, causal=causal, sm_scale=sm_scale))


def test_causal_counts_positions_from_the_start_of_both_sequences():
    """With fewer queries than keys, query i sees keys 0..i (top-left), as the kernel."""
    cpu = _inputs(sq=4, sk=8)
    dev = _on_device(cpu)
    _check(cpu, dev, _reference(*cpu, causal=True), ck.flash_attention(*dev, causal=True))


def test_segment_ids_keep_queries_in_their_segment():
    """Packed sequences, causal within each."""
    cpu = _inputs()
    q_seg = torch.tensor([[0, 0, 0, 1, 1, 1, 2, 2], [0, 1, 1, 1, 1, 2, 2, 2]])
    kv_seg = torch.tensor([[0, 0, 0, 1, 1, 1, 2, 2], [0, 1, 1, 1, 1, 2, 2, 2]])
    dev = _on_device(cpu)
    expected = _reference(*cpu, causal=True, q_seg=q_seg, kv_seg=kv_seg)
    actual = ck.flash_attention(*dev, causal=True, q_segment_ids=q_seg.to(DEV),
                                kv_segment_ids=kv_seg.to(DEV))
    _check(cpu, dev, expected, actual)


def test_a_query_that_sees_no_key_averages_every_value():
    """The last query's segment (9) has no key: the kernel adds a finite mask value, so the
    row is the mean of the values, not NaN. (Its gradient is PyTorch's SDPA's, which
    differs from the kernel's for such a row: both are rounding of a constant shift.)"""
    q, k, v = _inputs()
    q_seg = torch.tensor([[0, 0, 0, 1, 1, 1, 2, 9], [0, 1, 1, 1, 1, 2, 2, 2]])
    kv_seg = torch.tensor([[0, 0, 0, 1, 1, 1, 2, 2], [0, 1, 1, 1, 1, 2, 2, 2]])
    actual = ck.flash_attention(*_on_device([q, k, v]), q_segment_ids=q_seg.to(DEV),
                                kv_segment_ids=kv_seg.to(DEV)).detach().cpu()
    torch.testing.assert_close(actual, _reference(q, k, v, q_seg=q_seg, kv_seg=kv_seg).detach(),
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(actual[0, :, 7], v[0].detach().mean(1), atol=1e-5, rtol=1e-5)


def test_bias_is_added_before_the_scale_and_gets_its_gradient():
    cpu = _inputs(with_ab=True)
    dev = _on_device(cpu)
    q, k, v, ab = cpu
    _check(cpu, dev, _reference(q, k, v, causal=True, sm_scale=0.3, ab=ab),
           ck.flash_attention(*dev[:3], causal=True, sm_scale=0.3, ab=dev[3]))


def test_partition_spec_lays_out_the_inputs_and_output_over_the_mesh():
    mesh = xs.Mesh(np.arange(xs.device_count()), (xs.device_count(), 1), ("fsdp", "model"))
    cpu = _inputs()
    dev = _on_device(cpu)
    actual = ck.flash_attention(*dev, causal=True, partition_spec=("fsdp", None, None, None),
                                mesh=mesh)
    assert f"devices=[{xs.device_count()},1,1,1]" in xs.get_sharding(actual)
    _check(cpu, dev, _reference(*cpu, causal=True), actual)


def test_partition_spec_defaults_to_the_global_mesh():
    mesh = xs.Mesh(np.arange(xs.device_count()), (xs.device_count(), 1), ("fsdp", "model"))
    cpu = _inputs()
    previous = xs.get_global_mesh()
    xs.set_global_mesh(mesh)
    try:
        actual = ck.flash_attention(*_on_device(cpu), partition_spec=("fsdp", None, None, None))
    finally:
        xs.set_global_mesh(previous)
    torch.testing.assert_close(actual.cpu(), _reference(*cpu).detach(), atol=1e-5, rtol=1e-5)


def test_partition_spec_without_a_mesh_says_how_to_give_one():
    previous = xs.get_global_mesh()
    xs.set_global_mesh(None)
    try:
        with pytest.raises(ValueError, match="set_global_mesh"):
            ck.flash_attention(*_on_device(_inputs()), partition_spec=("fsdp", None, None, None))
    finally:
        xs.set_global_mesh(previous)


def test_kv_with_fewer_heads_is_refused_naming_the_shapes():
    q, k, v = _on_device(_inputs())
    with pytest.raises(ValueError, match=r"k \(2, 1, 8, 4\).*repeat k and v's heads"):
        ck.flash_attention(q, k[:, :1], v[:, :1])


def test_one_segment_id_without_the_other_is_refused():
    q, k, v = _on_device(_inputs())
    with pytest.raises(ValueError, match="both q_segment_ids and kv_segment_ids"):
        ck.flash_attention(q, k, v, q_segment_ids=torch.zeros(B, SQ, dtype=torch.long,
                                                              device=DEV))


# gmm: rows 0-2 in group 0, none in group 1, rows 3-9 in group 2, rows 10-11 in no group.
SIZES = torch.tensor([3, 0, 7], dtype=torch.int32)


def _gmm_reference(lhs, rhs, sizes):
    out, start = torch.zeros(lhs.shape[0], rhs.shape[-1]), 0
    for g, size in enumerate(sizes.tolist()):
        out[start:start + size] = lhs[start:start + size] @ rhs[g]
        start += size
    return out


@pytest.mark.parametrize("transpose_rhs", [False, True])
def test_gmm_multiplies_each_group_of_rows_by_its_matrix(transpose_rhs):
    g = torch.Generator().manual_seed(1)
    lhs = torch.randn(12, 5, generator=g, requires_grad=True)
    rhs = torch.randn(3, 5, 6, generator=g, requires_grad=True)
    dev = _on_device([lhs, rhs])
    stored = dev[1].transpose(-1, -2).detach().requires_grad_(True) if transpose_rhs else dev[1]
    actual = ck.gmm(dev[0], stored, SIZES.to(DEV), transpose_rhs=transpose_rhs)
    expected = _gmm_reference(lhs, rhs, SIZES)
    torch.testing.assert_close(actual.cpu(), expected.detach(), atol=1e-5, rtol=1e-5)
    expected.square().sum().backward()
    actual.square().sum().backward()
    torch.testing.assert_close(dev[0].grad.cpu(), lhs.grad, atol=1e-5, rtol=1e-5)
    rhs_grad = stored.grad.transpose(-1, -2) if transpose_rhs else stored.grad
    torch.testing.assert_close(rhs_grad.cpu(), rhs.grad, atol=1e-5, rtol=1e-5)


def test_gmm_backward_gives_the_gradients_autograd_gives():
    g = torch.Generator().manual_seed(2)
    lhs, rhs, grad = torch.randn(12, 5, generator=g), torch.randn(3, 5, 6, generator=g), \
        torch.randn(12, 6, generator=g)
    lhs_c, rhs_c = lhs.clone().requires_grad_(True), rhs.clone().requires_grad_(True)
    _gmm_reference(lhs_c, rhs_c, SIZES).backward(grad)
    grad_lhs, grad_rhs = ck.gmm_backward(grad.to(DEV), lhs.to(DEV), rhs.to(DEV), SIZES.to(DEV))
    torch.testing.assert_close(grad_lhs.cpu(), lhs_c.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad_rhs.cpu(), rhs_c.grad, atol=1e-5, rtol=1e-5)
    assert grad_rhs.shape == (3, 5, 6)


def test_serving_kernels_are_refused_naming_an_alternative():
    with pytest.raises(NotImplementedError, match="paged_attention.*scaled_dot_product"):
        ck.paged_attention
    with pytest.raises(NotImplementedError, match="gmm\\(group_offset"):
        ck.gmm(torch.ones(2, 2, device=DEV), torch.ones(1, 2, 2, device=DEV),
               torch.tensor([2], dtype=torch.int32, device=DEV), group_offset=torch.tensor(0))


def test_xla_builder_call_jax_passes_args_and_kwargs_with_gradients():
    import jax.numpy as jnp

    x = torch.randn(3, 4, requires_grad=True)
    d = x.detach().to(DEV).requires_grad_(True)
    out = xla_builder.call_jax(lambda a, b, *, c: a * jnp.sin(b) + c, (d, d), {"c": 2.0},
                               name="f", override_hash=1)
    expected = x * torch.sin(x) + 2.0
    torch.testing.assert_close(out.cpu(), expected.detach())
    expected.sum().backward()
    out.sum().backward()
    torch.testing.assert_close(d.grad.cpu(), x.grad)


def test_the_rest_of_the_hlo_builder_is_refused_naming_call_jax():
    with pytest.raises(NotImplementedError, match="xla_builder.Op.*torchspmd.call_jax"):
        xla_builder.Op
