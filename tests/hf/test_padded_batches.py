"""A padded batch (left padding on one row, right padding on another, a row of padding only,
labels -100 on padding) gives CPU's loss and every parameter's gradient, with the batch
sharded over 'data': SDPA's fully masked rows must not turn into NaN or wrong gradients.

One-layer models: a second layer adds compile time, not coverage."""

import numpy as np
import pytest
import torch

import torchspmd
from torchspmd.sharding import Mesh, mark_sharding

from tests.hf.models import VOCAB, cpu_and_copy

SEQ = 8


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=1, n_head=4, bos_token_id=1,
                        eos_token_id=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    return GPT2LMHeadModel(config)


def tiny_qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config)


def tiny_bert():
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=4, max_position_embeddings=64, pad_token_id=0,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    return BertForMaskedLM(config)


MODELS = {"llama": tiny_llama, "gpt2": tiny_gpt2, "qwen2": tiny_qwen2, "bert": tiny_bert}


def padded_batch():
    """ids, attention mask and labels of 4 rows: left padded, right padded, full, all padding."""
    ids = torch.randint(3, VOCAB, (4, SEQ), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(4, SEQ, dtype=torch.long)
    mask[0, :3] = 0
    mask[1, -2:] = 0
    mask[3] = 0
    ids = ids.masked_fill(mask == 0, 0)
    return ids, mask, ids.masked_fill(mask == 0, -100)


def loss_and_grads(model, device, mesh=None):
    batch = [t.to(device) for t in padded_batch()]
    if mesh is not None:
        for t in batch:
            mark_sharding(t, mesh, ("data", None))
    ids, mask, labels = batch
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    return loss.item(), {n: p.grad.cpu() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", MODELS)
def test_padded_batch_gives_cpu_loss_and_gradients(name):
    cpu, model = cpu_and_copy(MODELS[name])
    cpu_loss, cpu_grads = loss_and_grads(cpu, "cpu")
    mesh = Mesh(np.arange(8), (4, 2), ("data", "model"))
    loss, grads = loss_and_grads(model.to(torchspmd.device()), torchspmd.device(), mesh)
    assert np.isfinite(cpu_loss)
    np.testing.assert_allclose(loss, cpu_loss, rtol=1e-5, atol=1e-5)
    assert grads.keys() == cpu_grads.keys()
    largest = max(g.abs().max().item() for g in cpu_grads.values())
    for n, e in cpu_grads.items():
        diff = (grads[n] - e).abs().max().item()
        assert diff <= 1e-4 * largest, f"{n}: max abs diff {diff} (largest gradient {largest})"


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_a_compiled_step_over_a_padded_batch_gives_cpu_loss_and_gradients(name):
    """Hugging Face checks on the host whether a mask is all ones unless
    ``torch.compiler.is_compiling()``; a capture says it is, as ``torch.compile`` does,
    so the step compiles (it used to raise HostReadInStep) and replays."""
    cpu, model = cpu_and_copy(MODELS[name])
    cpu_loss, cpu_grads = loss_and_grads(cpu, "cpu")
    model.to(torchspmd.device())

    @torchspmd.compile
    def step(ids, mask, labels):
        model.zero_grad()
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        return loss

    replays = []
    for _ in range(3):  # captured with p.grad empty, then full; the third call replays
        loss = step(*[t.to(torchspmd.device()) for t in padded_batch()]).item()
        replays.append(torchspmd.metrics()["step_replays"])
    assert replays[2] == replays[1] + 1
    np.testing.assert_allclose(loss, cpu_loss, rtol=1e-5, atol=1e-5)
    largest = max(g.abs().max().item() for g in cpu_grads.values())
    for n, p in model.named_parameters():
        diff = (p.grad.cpu() - cpu_grads[n]).abs().max().item()
        assert diff <= 1e-4 * largest, f"{n}: max abs diff {diff} (largest gradient {largest})"
