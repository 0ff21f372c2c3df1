"""``shard_experts``: the plan it applies to each Hugging Face MoE layout, how the grouped
matmul partitions under it, and its errors.

Training with the plan (values equal to CPU) is tests/hf/test_moe.py.
"""

import re
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torchspmd
from torchspmd.debug.hlo import collectives, last_hlo
from torchspmd.parallel import ExpertRole, shard_experts
from torchspmd.sharding import Mesh, get_sharding, mark_sharding

DEV = torchspmd.device()
MESH = Mesh(np.arange(8), (4, 2), ("data", "model"))


def _quiet(make):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' notes on tiny configs
        torch.manual_seed(0)
        return make()


def tiny_gpt_oss():
    from transformers import GptOssConfig, GptOssForCausalLM

    return GptOssForCausalLM(GptOssConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=64, layer_types=["full_attention"]))


def tiny_deepseek_v3():
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    return DeepseekV3ForCausalLM(DeepseekV3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=4,
        num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
        topk_group=1, n_shared_experts=1, q_lora_rank=16, kv_lora_rank=16,
        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, max_position_embeddings=64))


def test_transposed_experts_with_biases_split_their_intermediate_dim():
    """GPT-OSS keeps experts as (experts, in, out) with biases: TP follows the intermediate
    dim wherever it is, the router (weight and bias) stays replicated."""
    model = _quiet(tiny_gpt_oss).to(DEV)
    plan = shard_experts(model, MESH)
    specs = {p.name.removeprefix("model.layers.0.mlp."): (p.role, p.spec) for p in plan.parameters}
    experts, router = ExpertRole.EXPERTS, ExpertRole.ROUTER
    assert specs == {
        "experts.gate_up_proj": (experts, ("data", None, "model")),       # (4, 32, 96)
        "experts.gate_up_proj_bias": (experts, ("data", "model")),        # (4, 96)
        "experts.down_proj": (experts, ("data", "model", None)),          # (4, 48, 32)
        "experts.down_proj_bias": (experts, ("data", None)),              # (4, 32)
        "router.weight": (router, (None, None)),
        "router.bias": (router, (None,)),
    }
    assert plan.blocks == ["model.layers.0.mlp"]
    gate_up = model.model.layers[0].mlp.experts.gate_up_proj
    assert get_sharding(gate_up) == "{devices=[4,1,2]0,1,2,3,4,5,6,7}"


def test_shared_experts_get_megatron_tensor_parallelism_and_dense_layers_are_left_alone():
    """DeepSeek-V3: the shared expert MLP splits over 'model' (column, then row), the first
    (dense) layer is not an MoE block and is not touched."""
    model = _quiet(tiny_deepseek_v3).to(DEV)
    plan = shard_experts(model, MESH, expert_axis="data", tp_axis="model")
    specs = {p.name: p.spec for p in plan.parameters}
    prefix = "model.layers.1.mlp."
    assert specs == {
        prefix + "experts.gate_up_proj": ("data", "model", None),
        prefix + "experts.down_proj": ("data", None, "model"),
        prefix + "gate.weight": (None, None),
        prefix + "shared_experts.gate_proj.weight": ("model", None),
        prefix + "shared_experts.up_proj.weight": ("model", None),
        prefix + "shared_experts.down_proj.weight": (None, "model"),
    }
    assert "shared expert" in str(plan) and "layers.0" not in str(plan)


def test_grouped_matmul_over_sharded_experts_moves_only_group_sizes_and_partial_sums():
    """Forward and backward of a grouped matmul whose experts are split over 'data' (and
    their rows over 'model'): no weight or activation is gathered and nothing is permuted;
    the only all-gathers are of the per-expert offsets, the combine is an all-reduce."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 16, generator=g).to(DEV).requires_grad_()
    w = torch.randn(4, 32, 16, generator=g).to(DEV).requires_grad_()
    mark_sharding(w, MESH, ("data", "model", None))
    ids = torch.sort(torch.randint(0, 4, (64,), generator=g)).values.to(DEV)
    offs = torch.cumsum((ids[:, None] == torch.arange(4).to(DEV)).sum(0), 0).to(torch.int32)
    out = F.grouped_mm(x, w.transpose(-2, -1), offs=offs)
    (out ** 2).sum().backward()
    torchspmd.sync()
    counts = collectives()
    assert counts["collective-permute"] == 0 and counts["all-to-all"] == 0, counts
    gathered = [line for line in last_hlo().splitlines() if " all-gather(" in line]
    assert gathered and all(re.search(r"= s(32|64)\[4\]", line) for line in gathered), gathered


def test_a_model_without_experts_is_an_error():
    with pytest.raises(ValueError, match="found no experts module in Linear"):
        shard_experts(torch.nn.Linear(4, 4).to(DEV), MESH)


@pytest.mark.parametrize("axes,message", [
    (dict(expert_axis="expert"), "'expert' is not an axis of the mesh"),
    (dict(expert_axis="model", tp_axis="model"), "expert_axis and tp_axis must differ"),
])
def test_bad_axes_are_an_error(axes, message):
    with pytest.raises(ValueError, match=message):
        shard_experts(_quiet(tiny_gpt_oss).to(DEV), MESH, **axes)


def test_experts_that_do_not_divide_over_the_expert_axis_are_an_error():
    """4 experts over 8 devices would reach XLA replicated: say so instead."""
    mesh = Mesh(np.arange(8), (8, 1), ("data", "model"))
    with pytest.raises(ValueError, match="has 4 experts, which do not split evenly over 'data'"):
        shard_experts(_quiet(tiny_gpt_oss).to(DEV), mesh)
