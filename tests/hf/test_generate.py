"""Greedy ``generate`` on a tiny Llama returns CPU's tokens, running each token's work once."""

import pytest
import torch

import torchspmd

from tests.hf.models import VOCAB, cpu_and_copy, tiny_llama

NEW_TOKENS = 4


def greedy(model, prompt, cache: str):
    extra = {"cache_implementation": "static"} if cache == "static" else {}
    with torch.no_grad():
        return model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                              max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, **extra)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_greedy_generate_matches_cpu_and_runs_each_op_once(cache):
    cpu, model = cpu_and_copy(tiny_llama)
    prompt = torch.randint(3, VOCAB, (2, 5), generator=torch.Generator().manual_seed(2))
    expected = greedy(cpu.eval(), prompt, cache)
    model.eval().to(torchspmd.device())
    torchspmd.sync()
    torchspmd.reset_metrics()
    actual = greedy(model, prompt.to(torchspmd.device()), cache)
    assert torch.equal(actual.cpu(), expected)
    m = torchspmd.metrics()
    # A read per token runs that token's work with everything else pending: none runs twice.
    assert m["ops_rerun"] == 0
