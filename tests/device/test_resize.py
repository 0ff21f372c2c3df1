"""resize_ and resize_as_ keep the first elements in storage order, as PyTorch does."""

import pytest
import torch


def test_resize_to_the_same_number_of_elements_keeps_every_value():
    cpu = torch.arange(24.0).reshape(2, 3, 4)
    t = cpu.to("spmd")
    t.resize_(6, 4)
    assert t.shape == (6, 4) and t.is_contiguous()
    torch.testing.assert_close(t.cpu(), cpu.clone().resize_(6, 4))


def test_resize_smaller_keeps_the_first_elements():
    t = torch.arange(10).to("spmd")
    t.resize_(2, 3)
    torch.testing.assert_close(t.cpu(), torch.arange(6).reshape(2, 3))


def test_resize_larger_keeps_the_old_elements_first():
    t = torch.arange(4.0).to("spmd")
    t.resize_(2, 3)
    assert t.shape == (2, 3)
    torch.testing.assert_close(t.cpu().reshape(-1)[:4], torch.arange(4.0))


def test_resize_smaller_keeps_the_storage_its_views_share():
    base, base_cpu = torch.arange(6.0).to("spmd"), torch.arange(6.0)
    view, view_cpu = base[1:4], base_cpu[1:4]
    base.resize_(2).add_(10)
    base_cpu.resize_(2).add_(10)
    torch.testing.assert_close(view.cpu(), view_cpu)
    torch.testing.assert_close(base.cpu(), base_cpu)


def test_resize_as_takes_the_template_shape():
    t = torch.arange(6.0).to("spmd")
    t.resize_as_(torch.zeros(3, 2).to("spmd"))
    torch.testing.assert_close(t.cpu(), torch.arange(6.0).reshape(3, 2))


def test_resize_of_a_non_contiguous_tensor_raises_naming_the_fix():
    t = torch.arange(6.0).reshape(2, 3).to("spmd").t()
    with pytest.raises(NotImplementedError, match="contiguous"):
        t.resize_(6)


def test_growing_any_tensor_keeps_its_values_and_identity():
    # A tensor an op made (not an ``empty``) has a placeholder storage of its own size:
    # growing it raised PyTorch's "out of bounds for storage" error before.
    x = torch.arange(12.0).reshape(3, 4)
    t = x.to("spmd") * 1
    same = id(t)
    t.resize_(4, 4)
    assert id(t) == same and t.shape == (4, 4) and t.stride() == (4, 1)
    assert torch.equal(t.cpu()[:3], x)
    t.add_(1)
    assert torch.equal(t.cpu()[:3], x + 1)
