"""Tiny Mixtral and Qwen2-MoE train with expert parallelism as on the CPU.

The experts are sharded with ``shard_experts`` (experts over 'data', each expert's
intermediate dim over 'model', the router replicated) and the batch over 'data'. Ten AdamW
steps, run step by step (lazy) or as a compiled step, give CPU's losses and final
parameters, and nothing compiles after step 3.

Tolerances: a step's values differ from CPU's only by float32 summation order (XLA's dots
and all-reduces add in another order), about 1e-7 relative per op; AdamW divides by
sqrt(v), which grows such differences on entries whose gradient is near zero, so after 10
steps at lr 1e-2 parameters are compared at 1e-4. A routing decision that flipped would
change values by far more than that.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

import torchspmd
from torchspmd.parallel import ExpertRole, shard_experts
from torchspmd.sharding import Mesh, mark_sharding

from tests.hf.models import VOCAB, batches, cpu_and_copy

STEPS = 10


def tiny_mixtral() -> torch.nn.Module:
    """Mixtral: 4 experts, top-2, gate and up projections stacked in one parameter."""
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           num_local_experts=4, num_experts_per_tok=2,
                           max_position_embeddings=64, pad_token_id=0)
    torch.manual_seed(0)
    return MixtralForCausalLM(config)


def tiny_qwen2_moe() -> torch.nn.Module:
    """Qwen2-MoE: 4 routed experts, top-2, plus a gated shared expert."""
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    config = Qwen2MoeConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                            moe_intermediate_size=32, shared_expert_intermediate_size=64,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            num_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
                            pad_token_id=0)
    torch.manual_seed(0)
    return Qwen2MoeForCausalLM(config)


MODELS = {"mixtral": tiny_mixtral, "qwen2_moe": tiny_qwen2_moe}


def _step(model, opt):
    def step(ids):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


def _train(model, device, mesh=None, compiled=False) -> tuple[list[float], list[int]]:
    """Losses of ``STEPS`` AdamW steps, and the graphs compiled during each."""
    step = _step(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    if compiled:
        step = torchspmd.compile(step)
    losses, compiles = [], []
    for ids in batches(STEPS):
        before = torchspmd.metrics()["graphs_compiled"]
        ids = ids.to(device)
        if mesh is not None:
            mark_sharding(ids, mesh, ("data", None))
        losses.append(step(ids).item())
        compiles.append(torchspmd.metrics()["graphs_compiled"] - before)
    return losses, compiles


@functools.cache
def _cpu_run(name: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    """CPU's losses and final parameters (one run per model, shared by both modes)."""
    cpu, _ = cpu_and_copy(MODELS[name])
    losses, _ = _train(cpu, "cpu")
    return losses, {n: p.detach().clone() for n, p in cpu.named_parameters()}


@pytest.mark.parametrize("compiled", [False, True], ids=["lazy", "compiled"])
@pytest.mark.parametrize("name", MODELS)
def test_expert_parallel_training_matches_cpu(name, compiled):
    expected, final = _cpu_run(name)
    _, model = cpu_and_copy(MODELS[name])
    mesh = Mesh(np.arange(8), (4, 2), ("data", "model"))
    plan = shard_experts(model.to(torchspmd.device()), mesh, expert_axis="data", tp_axis="model")
    routed = [p for p in plan.parameters if p.role is ExpertRole.EXPERTS]
    assert len(routed) == 4 and all(p.spec[0] == "data" for p in routed)
    losses, compiles = _train(model, torchspmd.device(), mesh, compiled)
    np.testing.assert_allclose(losses, expected, rtol=1e-5, atol=1e-5)
    assert sum(compiles[3:]) == 0, f"graphs compiled per step: {compiles}"
    for param_name, p in model.named_parameters():
        torch.testing.assert_close(p.detach().cpu(), final[param_name], rtol=1e-4, atol=1e-4,
                                   msg=param_name)
