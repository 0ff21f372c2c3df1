"""embedding_bag (and embedding with max_norm) on the device, forward and backward, against CPU.

The auxiliary outputs of ``_embedding_bag`` follow PyTorch's meta kernel (not CPU's
shapes), so behaviour is compared through ``F.embedding_bag`` and its gradients.
"""

import pytest
import torch
import torch.nn.functional as F

g = torch.Generator().manual_seed(0)
weight = torch.randn(10, 3, generator=g)
indices = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0, 4])
offsets = torch.tensor([0, 4, 4, 7])  # bag 1 is empty
samples = torch.rand(10, generator=g)


def _both(fn, *tensors):
    """fn's output and the gradients of its leaves, on CPU and on the device."""
    results = []
    for device in ("cpu", "spmd"):
        leaves = [t.detach().to(device).requires_grad_(t.is_floating_point()) for t in tensors]
        out = fn(*leaves)
        (out * torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape).to(device)).sum().backward()
        results.append([out] + [t.grad for t in leaves if t.requires_grad])
    for cpu, spmd in zip(*results):
        torch.testing.assert_close(spmd.cpu(), cpu)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_modes(mode):
    _both(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode), weight, indices, offsets)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_skips_padding_idx(mode):
    _both(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode, padding_idx=4), weight, indices, offsets)


def test_embedding_bag_with_per_sample_weights():
    _both(lambda w, i, o, s: F.embedding_bag(i, w, o, mode="sum", per_sample_weights=s),
          weight, indices, offsets, samples)


def test_embedding_bag_with_include_last_offset():
    last = torch.tensor([0, 4, 4, 7, 10])
    _both(lambda w, i, o: F.embedding_bag(i, w, o, mode="mean", include_last_offset=True),
          weight, indices, last)


def test_embedding_bag_of_2d_input():
    _both(lambda w, i: F.embedding_bag(i, w, mode="max"), weight, indices[:8].reshape(2, 4))


def test_embedding_bag_scales_gradients_by_frequency_like_embedding():
    # CPU's own embedding_bag scaling divides some rows and not others; embedding's is the
    # documented meaning (each row's gradient divided by its count in the batch).
    rows = indices[:8].reshape(2, 4)
    w_cpu = weight.clone().requires_grad_(True)
    F.embedding(rows, w_cpu, scale_grad_by_freq=True).sum(1).sum().backward()
    w = weight.to("spmd").requires_grad_(True)
    F.embedding_bag(rows.to("spmd"), w, mode="sum", scale_grad_by_freq=True).sum().backward()
    torch.testing.assert_close(w.grad.cpu(), w_cpu.grad)


def test_embedding_bag_refuses_sparse_gradients():
    w = weight.to("spmd").requires_grad_(True)
    out = F.embedding_bag(indices.to("spmd"), w, offsets.to("spmd"), sparse=True)
    with pytest.raises(NotImplementedError, match="sparse=True"):
        out.sum().backward()
        w.grad.cpu()


def test_embedding_with_max_norm_renormalizes_the_rows_it_reads_like_cpu():
    big = weight * 3
    w_cpu, w = big.clone(), big.to("spmd")
    rows = torch.tensor([[0, 2], [2, 7]])
    out_cpu = F.embedding(rows, w_cpu, max_norm=1.5, norm_type=3.0)
    out = F.embedding(rows.to("spmd"), w, max_norm=1.5, norm_type=3.0)
    torch.testing.assert_close(out.cpu(), out_cpu)
    torch.testing.assert_close(w.cpu(), w_cpu)  # the weight itself is renormalized in place


def test_embedding_with_sparse_gradients_is_refused_naming_the_dense_alternative():
    table = torch.nn.Embedding(10, 4, sparse=True).to("spmd")
    with pytest.raises(NotImplementedError, match=r"dense tensors only.*sparse=False"):
        table(indices[:4].to("spmd")).sum().backward()
        table.weight.grad.cpu()
