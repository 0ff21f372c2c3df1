"""PyTorch's tensor-parallel plans and DTensor placements on the spmd device."""

import copy
from collections import OrderedDict

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                               RowwiseParallel, SequenceParallel)
from torch.testing._internal.distributed.fake_pg import FakeStore

from torchspmd import Mesh, get_sharding, mark_sharding
from torchspmd.parallel import (convert_to_xla_mesh, parallelize_module, placements_to_spec,
                                spec_to_placements, xla_distribute_tensor)


@pytest.fixture(scope="module")
def device_mesh():
    """A (dp=2, tp=4) DeviceMesh over a fake 8-rank process group (no communication)."""
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    yield init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    dist.destroy_process_group()


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.wq, self.wk, self.wv = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (w(x).view(b, t, -1, d // self.heads).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, d))


class FeedForward(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.w1, self.w3 = nn.Linear(dim, 2 * dim, bias=False), nn.Linear(dim, 2 * dim, bias=False)
        self.w2 = nn.Linear(2 * dim, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class LlamaBlock(nn.Module):
    def __init__(self, dim: int = 16, heads: int = 4):
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.attention, self.feed_forward = Attention(dim, heads), FeedForward(dim)

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


# torchtitan's Llama plan, as written for DTensor (sequence parallel norms included).
TITAN_PLAN = {
    "attention_norm": SequenceParallel(),
    "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
    "attention.w[qkv]": ColwiseParallel(),  # fnmatch patterns, per path component
    "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
    "ffn_norm": SequenceParallel(),
    "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
    "feed_forward.w1": ColwiseParallel(),
    "feed_forward.w3": ColwiseParallel(),
    "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
}


def text_of(shape, mesh: Mesh, spec) -> str:
    t = torch.zeros(shape).to("spmd")
    mark_sharding(t, mesh, spec)
    return get_sharding(t)


def hand_sharded(block: LlamaBlock, mesh: Mesh) -> LlamaBlock:
    """The Megatron layout written with mark_sharding."""
    for w in (block.attention.wq, block.attention.wk, block.attention.wv,
              block.feed_forward.w1, block.feed_forward.w3):
        mark_sharding(w.weight, mesh, ("tp", None))
    for w in (block.attention.wo, block.feed_forward.w2):
        mark_sharding(w.weight, mesh, (None, "tp"))
    return block


def train(block: nn.Module, device: str, mesh: Mesh | None = None, steps: int = 3) -> list[float]:
    opt = torch.optim.SGD(block.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        x = torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(step)).to(device)
        if mesh is not None:
            mark_sharding(x, mesh, ("dp", None, None))
        loss = block(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def test_a_torchtitan_llama_plan_trains_like_hand_written_sharding_and_cpu(device_mesh):
    torch.manual_seed(0)
    cpu = LlamaBlock()
    mesh = convert_to_xla_mesh(device_mesh)
    planned = parallelize_module(copy.deepcopy(cpu).to("spmd"), device_mesh["tp"], TITAN_PLAN)
    hand = hand_sharded(copy.deepcopy(cpu).to("spmd"), mesh)
    for (name, p), q in zip(planned.named_parameters(), hand.parameters()):
        assert get_sharding(p) == get_sharding(q), name
    expected = train(cpu, "cpu")
    np.testing.assert_allclose(train(planned, "spmd", mesh), expected, rtol=1e-5)
    np.testing.assert_allclose(train(hand, "spmd", mesh), expected, rtol=1e-5)
    for p, q in zip(cpu.parameters(), planned.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach())


def test_a_torchspmd_mesh_takes_the_tensor_parallel_axis_by_name():
    mesh = Mesh(np.arange(8), (2, 4), ("dp", "tp"))
    cpu = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
    mlp = copy.deepcopy(cpu).to("spmd")
    parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()}, tp_axis="tp")
    assert get_sharding(mlp[0].weight) == text_of((32, 16), mesh, ("tp", None))
    assert get_sharding(mlp[0].bias) == text_of((32,), mesh, ("tp",))
    assert get_sharding(mlp[2].weight) == text_of((16, 32), mesh, (None, "tp"))
    x = torch.randn(8, 16)
    torch.testing.assert_close(mlp(x.to("spmd")).cpu(), cpu(x), rtol=1e-5, atol=1e-5)


def test_a_mesh_of_several_axes_needs_tp_axis():
    with pytest.raises(ValueError, match="tp_axis="):
        parallelize_module(nn.Linear(4, 4).to("spmd"), Mesh(np.arange(8), (2, 4), ("dp", "tp")),
                           ColwiseParallel())


def test_a_style_on_a_module_it_cannot_shard_is_refused():
    model = nn.Sequential(OrderedDict(act=nn.ReLU()))
    with pytest.raises(NotImplementedError, match="nn.Linear and nn.Embedding; 'act' is a ReLU"):
        parallelize_module(model, Mesh(np.arange(8), (8,), ("tp",)), {"act": ColwiseParallel()})


def test_placements_and_partition_specs_convert_both_ways():
    assert placements_to_spec([Replicate(), Shard(0)], 2, ("dp", "tp")) == ("tp", None)
    assert placements_to_spec([Shard(1), Shard(1)], 2, ("dp", "tp")) == (None, ("dp", "tp"))
    assert spec_to_placements(("tp", None), ("dp", "tp")) == [Replicate(), Shard(0)]
    assert spec_to_placements((None, "dp"), ("dp", "tp")) == [Shard(1), Replicate()]


def test_partial_placements_are_refused_with_the_fix():
    with pytest.raises(NotImplementedError, match="never partial sums"):
        placements_to_spec([Partial()], 2, ("tp",))


def test_convert_to_xla_mesh_keeps_ranks_and_names(device_mesh):
    mesh = convert_to_xla_mesh(device_mesh)
    assert mesh.mesh_shape == (2, 4) and mesh.axis_names == ("dp", "tp")
    assert list(mesh.device_ids) == list(range(8))


def test_xla_distribute_tensor_shards_by_placements(device_mesh):
    t = torch.randn(8, 16)
    xt = xla_distribute_tensor(t, device_mesh, [Shard(1), Shard(0)])
    assert xt.sharding_spec == "{devices=[4,2]0,4,1,5,2,6,3,7}"
    torch.testing.assert_close(xt.global_tensor.cpu(), t)
