"""annotate_custom_sharding, mark_sharding_with_gradients and shard_as (spec §1.6)."""

import re

import numpy as np
import pytest
import torch

import torchspmd
from torchspmd.debug import collectives, last_hlo
from torchspmd.sharding import (Mesh, annotate_custom_sharding, get_sharding, mark_sharding,
                                mark_sharding_with_gradients, shard_as)

N = 8
TILED_2x4 = "{devices=[2,4]0,1,2,3,4,5,6,7}"
PARTIAL_2x4 = "{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"
FSDP_GATHERED = "{devices=[1,2,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"  # spec §1.6


def fsdp_tp_mesh() -> Mesh:
    return Mesh(np.arange(N), (4, 2), ("fsdp", "tp"))


def mesh_2x4() -> Mesh:
    return Mesh(np.arange(N), (2, 4))


def test_annotation_is_visible_before_sync():
    w = torch.randn(16, 16).to("spmd")
    mark_sharding(w, fsdp_tp_mesh(), ("fsdp", "tp"))
    annotate_custom_sharding(w, fsdp_tp_mesh(), (None, "tp"))
    assert get_sharding(w) == FSDP_GATHERED


def test_annotated_layout_is_held_after_sync():
    cpu = torch.randn(16, 16)
    w = cpu.to("spmd")
    mark_sharding(w, fsdp_tp_mesh(), ("fsdp", "tp"))
    annotate_custom_sharding(w, fsdp_tp_mesh(), (None, "tp"))
    torchspmd.sync()
    assert get_sharding(w) == FSDP_GATHERED
    assert w.handle.value()[0].arrays[0].addressable_shards[0].data.shape == (16, 8)
    torch.testing.assert_close(w.cpu(), cpu)


def test_annotating_sharded_device_data_is_allowed():
    cpu = torch.randn(8, 8)
    x = cpu.to("spmd")
    mark_sharding(x, mesh_2x4(), (0, 1))
    (x + 0).cpu()  # x is now sharded device data: mark_sharding would refuse (0, None)
    annotate_custom_sharding(x, mesh_2x4(), (0, None))
    torchspmd.sync()
    assert get_sharding(x) == PARTIAL_2x4
    torch.testing.assert_close(x.cpu(), cpu)


def test_annotation_moves_no_data_until_sync():
    x = torch.randn(8, 8).to("spmd")
    mark_sharding(x, mesh_2x4(), (0, 1))
    runs = torchspmd.metrics()["executions"]
    annotate_custom_sharding(x, mesh_2x4(), (None, 1))
    assert torchspmd.metrics()["executions"] == runs
    assert not x.handle.value()[0].is_leaf


def test_annotation_may_be_repeated_with_another_spec():
    x = torch.randn(8, 8).to("spmd")
    mark_sharding(x, mesh_2x4(), (0, 1))
    annotate_custom_sharding(x, mesh_2x4(), (None, 1))
    annotate_custom_sharding(x, mesh_2x4(), (0, None))
    torchspmd.sync()
    assert get_sharding(x) == PARTIAL_2x4


def test_annotation_checks_rank():
    with pytest.raises(AssertionError, match="should be equal to the input rank"):
        annotate_custom_sharding(torch.randn(8, 8).to("spmd"), mesh_2x4(), (0,))


def _fsdp_tp_matmul():
    """The seed's use case: an FSDP+TP weight gathered over fsdp before a matmul."""
    torch.manual_seed(0)
    x_cpu, w_cpu = torch.randn(16, 32), torch.randn(32, 64)
    mesh = fsdp_tp_mesh()
    x, w = x_cpu.to("spmd"), w_cpu.to("spmd")
    mark_sharding(x, mesh, ("fsdp", None))
    mark_sharding(w, mesh, ("fsdp", "tp"))
    annotate_custom_sharding(w, mesh, (None, "tp"))
    y = x @ w
    torchspmd.sync()
    return y, x_cpu @ w_cpu, w


def test_fsdp_tp_annotation_gathers_weights_before_matmul():
    y, expected, w = _fsdp_tp_matmul()
    assert collectives()["all-gather"] >= 1
    # w (32, 64): all of dim 0 (gathered over fsdp), half of dim 1 (still split over tp).
    assert re.search(r"= f32\[32,32\]\{1,0\} all-gather\(", last_hlo())
    assert get_sharding(w) == FSDP_GATHERED
    torch.testing.assert_close(y.cpu(), expected, rtol=1e-4, atol=1e-4)


def test_mark_sharding_with_gradients_shards_output():
    x = torch.randn(8, 8).to("spmd").requires_grad_()
    y = mark_sharding_with_gradients(x, mesh_2x4(), (0, None))
    assert y is not x and get_sharding(y) == PARTIAL_2x4
    assert get_sharding(x) == ""  # not in place


def test_mark_sharding_with_gradients_shards_the_gradient():
    cpu = torch.randn(8, 8)
    x = cpu.to("spmd").requires_grad_()
    y = mark_sharding_with_gradients(x, mesh_2x4(), (0, None))
    (y * y).sum().backward()
    torchspmd.sync()
    assert get_sharding(x.grad) == PARTIAL_2x4
    torch.testing.assert_close(x.grad.cpu(), 2 * cpu)


@pytest.mark.parametrize("loss", [lambda y: y.sum(), lambda y: (y.t() * 3).sum(),
                                  lambda y: y.t().mean()],
                         ids=["sum: an expanded gradient", "a transposed gradient",
                              "mean of a transpose"])
def test_mark_sharding_with_gradients_shards_a_gradient_autograd_copies(loss):
    """A gradient whose strides differ from its parameter's is copied by autograd into
    ``.grad`` (``copy_`` keeps the target's annotation, not the source's): the constraint's
    output is row-major, as PyTorch/XLA's tensors are, so ``.grad`` is the constrained
    value itself, pending and after ``sync``."""
    cpu = torch.randn(8, 8, requires_grad=True)
    x = cpu.detach().to("spmd").requires_grad_()
    y = mark_sharding_with_gradients(x, mesh_2x4(), (0, None))
    loss(y).backward()
    loss(cpu).backward()
    assert get_sharding(x.grad) == PARTIAL_2x4
    torchspmd.sync()
    assert get_sharding(x.grad) == PARTIAL_2x4
    torch.testing.assert_close(x.grad.cpu(), cpu.grad)


def test_shard_as_lends_the_annotated_sharding():
    a_cpu, b_cpu = torch.randn(8, 8), torch.arange(64.0).reshape(8, 8)
    a = a_cpu.to("spmd")
    mark_sharding(a, mesh_2x4(), (0, 1))
    # b is computed on the device from nothing: no unannotated data in the graph.
    b = torch.arange(64.0, device="spmd").reshape(8, 8)
    a2, b2 = shard_as(a * 2, b + 1)
    torchspmd.sync()
    assert get_sharding(b2) == get_sharding(a2) == TILED_2x4
    torch.testing.assert_close(b2.cpu(), b_cpu + 1)
    torch.testing.assert_close(a2.cpu(), a_cpu * 2)


def test_shard_as_walks_pytrees():
    a = {"w": torch.randn(8, 8).to("spmd"), "n": None}
    b = {"w": torch.ones(8, 8, device="spmd"), "n": None}
    mark_sharding(a["w"], mesh_2x4(), (0, 1))
    a2, b2 = shard_as(a, b)
    assert b2["n"] is None
    torchspmd.sync()
    assert get_sharding(b2["w"]) == TILED_2x4


def test_shard_as_requires_the_same_structure():
    with pytest.raises(AssertionError, match="same structure"):
        shard_as([torch.randn(2).to("spmd")], (torch.randn(2).to("spmd"),))
