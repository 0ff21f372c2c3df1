"""``as_strided`` reads and writes a tensor's storage in memory order, as on CPU.

Its size, stride and offset address the *storage*, whatever view it is called on: a
transpose, a slice, a channels-last or ``empty_like(x.t())`` storage. (Before, the view's
values were taken as if they were memory: ``x.t().as_strided(...)`` read transposed
elements.) Gradients are CPU's too.
"""

import pytest
import torch

VIEWS = {
    "base": lambda x: x.as_strided((2, 3), (1, 2), 1),
    "transpose": lambda x: x.t().as_strided((2, 2), (1, 4)),
    "row slice": lambda x: x[1:].as_strided((2, 2), (1, 4)),
    "row slice, explicit offset": lambda x: x[1:].as_strided((2, 2), (1, 4), 1),
    "column slice": lambda x: x[:, 1:].as_strided((3, 3), (4, 1)),
    "channels last": lambda x: x.reshape(1, 3, 2, 2).contiguous(
        memory_format=torch.channels_last).as_strided((4,), (1,)),
    "empty_like a transpose": lambda x: torch.empty_like(x.t()).copy_(x.t()).as_strided(
        (3,), (1,)),
    "overlapping": lambda x: x.as_strided((3, 3), (1, 1)),
}
GRADIENT_CASES = [name for name in VIEWS if name != "row slice, explicit offset"]


def base(device="cpu") -> torch.Tensor:
    return torch.arange(12.0).reshape(3, 4).to(device)


@pytest.mark.parametrize("view", list(VIEWS))
def test_reading_matches_cpu(view):
    assert torch.equal(VIEWS[view](base("spmd")).cpu(), VIEWS[view](base()))


@pytest.mark.parametrize("view", ["transpose", "channels last", "base"])
def test_writing_through_it_matches_cpu(view):
    def write(x):
        VIEWS[view](x).mul_(-1)
        return x

    assert torch.equal(write(base("spmd").clone()).cpu(), write(base().clone()))


@pytest.mark.parametrize("view", GRADIENT_CASES)
def test_gradients_match_cpu(view):
    grads = []
    for device in ("cpu", "spmd"):
        leaf = base(device).requires_grad_()
        out = VIEWS[view](leaf * 1)
        weights = torch.arange(1.0, out.numel() + 1).reshape(out.shape).to(device)
        (out * weights).sum().backward()
        grads.append(leaf.grad.cpu())
    assert torch.equal(grads[1], grads[0])


def test_an_explicit_offset_into_an_offset_view_with_autograd_is_refused():
    leaf = base("spmd").requires_grad_()
    with pytest.raises(NotImplementedError, match="storage_offset"):
        (leaf * 1)[1:].as_strided((2, 2), (1, 4), 1)


@pytest.mark.parametrize("view", ["base", "transpose", "channels last"])
def test_as_strided_in_place_makes_the_tensor_that_view_of_its_storage(view):
    def reshape_in_place(x):
        layouts = {"base": x.clone(), "transpose": x.t().clone(),
                   "channels last": x.reshape(1, 3, 2, 2).contiguous(
                       memory_format=torch.channels_last)}
        y = layouts[view]
        y.as_strided_((2, 2), (1, 4), 1)
        return y.add_(100)

    got = reshape_in_place(base("spmd"))
    expected = reshape_in_place(base())
    assert got.stride() == expected.stride()
    assert torch.equal(got.cpu(), expected)


def test_as_strided_scatter_into_a_row_major_tensor_matches_cpu():
    src = -torch.ones(2, 2)
    expected = torch.as_strided_scatter(base(), src, (2, 2), (1, 4), 1)
    got = torch.as_strided_scatter(base("spmd"), src.to("spmd"), (2, 2), (1, 4), 1)
    assert torch.equal(got.cpu(), expected)


def test_as_strided_scatter_into_another_layout_is_refused():
    with pytest.raises(NotImplementedError, match="contiguous"):
        torch.as_strided_scatter(base("spmd").t(), -torch.ones(2, 2, device="spmd"),
                                 (2, 2), (1, 4), 1)
