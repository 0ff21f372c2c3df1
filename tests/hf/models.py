"""Tiny Hugging Face models built in code (no downloads) and a training loop to compare."""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

import torchspmd

VOCAB, SEQ, BATCH = 64, 8, 8


def tiny_llama() -> nn.Module:
    """Llama with GQA (4 query heads, 2 key/value heads), RoPE and RMSNorm."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                         eos_token_id=2)
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def tiny_sliding_mistral() -> nn.Module:
    """Mistral whose sliding window (6) is shorter than a prompt and its new tokens."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           max_position_embeddings=64, sliding_window=6, pad_token_id=0,
                           bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return MistralForCausalLM(config)


def tiny_gpt2() -> nn.Module:
    """GPT-2, whose ``lm_head`` is tied to the token embedding ``wte``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                        bos_token_id=1, eos_token_id=2, resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0)
    torch.manual_seed(0)
    return GPT2LMHeadModel(config)


def batches(steps: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(3, VOCAB, (BATCH, SEQ), generator=gen) for _ in range(steps)]


def train(model: nn.Module, device, steps: int = 10, prepare_batch=None) -> tuple[list[float], list[int]]:
    """Losses of ``steps`` AdamW steps on causal LM batches, and graphs compiled per step."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, compiled = [], []
    for ids in batches(steps):
        ids = ids.to(device)
        if prepare_batch is not None:
            prepare_batch(ids)
        before = torchspmd.metrics()["graphs_compiled"]
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        compiled.append(torchspmd.metrics()["graphs_compiled"] - before)
    return losses, compiled


def cpu_and_copy(make) -> tuple[nn.Module, nn.Module]:
    """A model for the CPU and an identical copy for the device."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' notes on tiny configs
        model = make()
    return model, copy.deepcopy(model)


def on_device(make, **buckets) -> tuple[nn.Module, nn.Module]:
    """A model in eval mode on the CPU, and its copy on the device with
    ``compile_generate(copy, **buckets)`` (the generation tests)."""
    import torchspmd.generation

    cpu, model = cpu_and_copy(make)
    model.eval().to(torchspmd.device())
    return cpu.eval(), torchspmd.generation.compile_generate(model, **buckets)
