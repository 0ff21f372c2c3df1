"""Tiny Llama and GPT-2 train on the spmd device as on the CPU: unsharded, FSDPv2, tensor parallel.

Losses of 10 AdamW steps match CPU within 1e-4 and nothing compiles after step 3.
"""

import functools

import numpy as np
import pytest
import torch
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

import torchspmd
from torchspmd.parallel import SpmdFullyShardedDataParallel as FSDPv2
from torchspmd.sharding import Mesh, mark_sharding

from tests.hf.models import cpu_and_copy, tiny_gpt2, tiny_llama, train

MODELS = {"llama": tiny_llama, "gpt2": tiny_gpt2}


def check_like_cpu(cpu_losses, losses, compiled):
    np.testing.assert_allclose(losses, cpu_losses, atol=1e-4, rtol=1e-4)
    assert sum(compiled[3:]) == 0, f"graphs compiled per step: {compiled}"


def shard_logits(output, mesh: Mesh) -> None:
    """HF Trainer's ``shard_output`` for FSDPv2: the batch dim of the logits over 'fsdp'."""
    logits = output if isinstance(output, torch.Tensor) else (
        output[0] if isinstance(output, tuple) else output.logits)
    mark_sharding(logits, mesh, ("fsdp",) + (None,) * (logits.dim() - 1))


@pytest.mark.parametrize("name", MODELS)
def test_unsharded_training_matches_cpu(name):
    cpu, model = cpu_and_copy(MODELS[name])
    cpu_losses, _ = train(cpu, "cpu")
    losses, compiled = train(model.to(torchspmd.device()), torchspmd.device())
    check_like_cpu(cpu_losses, losses, compiled)


@pytest.mark.parametrize("name", MODELS)
def test_fsdpv2_with_auto_wrap_over_no_split_modules_matches_cpu(name):
    cpu, model = cpu_and_copy(MODELS[name])
    mesh = Mesh(np.arange(8), (8,), ("fsdp",))
    # As HF's Trainer does: one FSDPv2 unit per class named in _no_split_modules.
    layer_classes = {type(m) for m in model.modules() if type(m).__name__ in model._no_split_modules}
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=layer_classes)
    wrapped = FSDPv2(model, mesh=mesh, shard_output=shard_logits, auto_wrap_policy=policy)
    assert sum(isinstance(m, FSDPv2) for m in wrapped.modules()) == 3  # the root and 2 layers
    cpu_losses, _ = train(cpu, "cpu")
    losses, compiled = train(wrapped, torchspmd.device(),
                             prepare_batch=lambda ids: mark_sharding(ids, mesh, ("fsdp", None)))
    check_like_cpu(cpu_losses, losses, compiled)


# Megatron-style: the first projection of each block split by output columns, the second
# by input rows, so each block needs one all-reduce. (name pattern, dim split over 'model')
TP_PLANS = {
    "llama": [(("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"), 0),
              (("o_proj", "down_proj"), 1)],
    # GPT-2's Conv1D keeps its weight as (in, out): columns are dim 1.
    "gpt2": [(("c_attn", "mlp.c_fc"), 1), (("attn.c_proj", "mlp.c_proj"), 0)],
}


@pytest.mark.parametrize("name", MODELS)
def test_megatron_tensor_parallel_matches_cpu(name):
    cpu, model = cpu_and_copy(MODELS[name])
    model.to(torchspmd.device())
    mesh = Mesh(np.arange(8), (2, 4), ("data", "model"))
    sharded = 0
    for param_name, param in model.named_parameters():
        for suffixes, dim in TP_PLANS[name]:
            if param_name.endswith(".weight") and any(s in param_name for s in suffixes):
                spec = [None] * param.dim()
                spec[dim] = "model"
                mark_sharding(param, mesh, tuple(spec))
                sharded += 1
    assert sharded == (14 if name == "llama" else 8)
    cpu_losses, _ = train(cpu, "cpu")
    losses, compiled = train(model, torchspmd.device(),
                             prepare_batch=lambda ids: mark_sharding(ids, mesh, ("data", None)))
    check_like_cpu(cpu_losses, losses, compiled)
