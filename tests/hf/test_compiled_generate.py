"""``compile_generate``: Hugging Face ``generate`` returns CPU's tokens and, with a static
cache, compiles one prefill program per prompt bucket and one decode program; each token
after the first is one replayed program, and greedy calls make them all in one launch of
a loop on the device (``test_greedy_loop.py``).

Models are built once per module; compiled programs are shared across tests through the
runtime's compile cache, so each test states its counts as what *its* calls ran.
"""

import warnings

import pytest
import torch

import torchspmd
import torchspmd.generation
from torchspmd.generation import RecompileWarning

from tests.hf.models import (VOCAB, cpu_and_copy, on_device, tiny_gpt2, tiny_llama,
                             tiny_sliding_mistral)

NEW_TOKENS = 8


def prompt_of(length: int, seed: int = 2, batch: int = 1) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def generate(model, prompt, new_tokens=NEW_TOKENS, cache="static", sample=False, mask=None,
             seed=0):
    """``generate`` on the host or the device; its tokens on the host, and the counters it moved."""
    device = next(model.parameters()).device
    mask = torch.ones_like(prompt) if mask is None else mask
    extra = {"cache_implementation": "static"} if cache == "static" else {}
    torchspmd.sync()
    torchspmd.reset_metrics()
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(prompt.to(device), attention_mask=mask.to(device), do_sample=sample,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens, **extra)
    assert out.device == device
    return out.cpu(), torchspmd.metrics()


def assert_decode_programs(m, new_tokens=NEW_TOKENS):
    """The prefill, then one decode program per further token (captured once, then
    replayed), or, greedy, one launch of the device loop that makes all of them."""
    launches = 1 if m["generate_device_loops"] else new_tokens - 1
    assert m["executions"] == 1 + launches
    assert m["step_replays"] + m["step_captures"] == launches
    assert m["generate_device_tokens"] == (new_tokens - 1 if m["generate_device_loops"] else 0)


def test_static_cache_compiles_as_much_for_64_tokens_as_for_8():
    # A cache length (multiple of 48) no other test uses: these calls compile their own.
    cpu, model = on_device(tiny_llama, cache_multiple=48)
    counts = []
    for new_tokens in (8, 64):
        prompt = prompt_of(5)
        tokens, m = generate(model, prompt, new_tokens)
        assert torch.equal(tokens, generate(cpu, prompt, new_tokens)[0])
        assert_decode_programs(m, new_tokens)
        counts.append(m["graphs_compiled"])
    # one prefill and one decode program each (the 64-token cache is longer: its own two)
    assert counts == [2, 2]


@pytest.mark.parametrize("name", ["llama", "gpt2"])
@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
def test_static_cache_generate_matches_cpu_with_two_programs(name, sample, request):
    cpu, model = request.getfixturevalue(name)
    prompt = prompt_of(5)
    tokens, m = generate(model, prompt, sample=sample, seed=3)
    assert torch.equal(tokens, generate(cpu, prompt, sample=sample, seed=3)[0])
    assert_decode_programs(m)
    # greedy: its tokens picked on the device (``test_greedy_loop.py``)
    assert m["generate_device_loops"] == (0 if sample else 1)
    assert m["graphs_compiled"] <= 2


@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_a_left_padded_batch_generates_cpu_tokens(llama, cache):
    """A row whose mask starts with zeros: its padding's attention rows are fully masked
    (they were NaN on the device before those rows took CPU's values)."""
    cpu, model = llama
    prompt = prompt_of(9, seed=4, batch=2)
    mask = torch.ones_like(prompt)
    mask[0, :3] = 0
    tokens = generate(model, prompt, new_tokens=3, cache=cache, mask=mask)[0]
    assert torch.equal(tokens, generate(cpu, prompt, new_tokens=3, cache=cache, mask=mask)[0])


def test_sampling_with_a_fixed_seed_reproduces(llama):
    _, model = llama
    prompt = prompt_of(5)
    first = generate(model, prompt, sample=True, seed=7)[0]
    assert torch.equal(generate(model, prompt, sample=True, seed=7)[0], first)
    assert not torch.equal(generate(model, prompt, sample=True, seed=8)[0], first)


def test_prompt_bucket_is_reused_across_prompt_lengths(llama):
    cpu, model = llama
    generate(model, prompt_of(5))  # bucket 16, cache 64: compiled here or by an earlier test
    # Another length in the same bucket: nothing new to compile.
    prompt = prompt_of(9, seed=4)
    tokens, m = generate(model, prompt)
    assert torch.equal(tokens, generate(cpu, prompt)[0])
    assert m["graphs_compiled"] == 0
    # A longer prompt: the next bucket's prefill program only (same decode program).
    prompt = prompt_of(17, seed=5)
    tokens, m = generate(model, prompt)
    assert torch.equal(tokens, generate(cpu, prompt)[0])
    assert m["graphs_compiled"] <= 1
    assert_decode_programs(m)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_dynamic_cache_matches_cpu_and_counts_each_recompile_with_one_warning(name, request):
    cpu, model = request.getfixturevalue(name)
    prompt = prompt_of(6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tokens, m = generate(model, prompt, new_tokens=4, cache="dynamic")
    assert torch.equal(tokens, generate(cpu, prompt, new_tokens=4, cache="dynamic")[0])
    # Each decode token's cache is a column longer: a new program each, never silently.
    assert m["generate_recompiles"] == 3 == m["generate_recompiles_cache"]
    warned = [w for w in caught if issubclass(w.category, RecompileWarning)]
    assert len(warned) == 1
    assert 'cache_implementation="static"' in str(warned[0].message)
    # Sampled, same shapes: the programs compiled above run again, tokens still CPU's.
    tokens, m = generate(model, prompt, new_tokens=4, cache="dynamic", sample=True, seed=3)
    cpu_tokens = generate(cpu, prompt, new_tokens=4, cache="dynamic", sample=True, seed=3)[0]
    assert torch.equal(tokens, cpu_tokens)
    assert m["graphs_compiled"] == 0 == m["generate_recompiles"]


def test_a_static_cache_with_sliding_window_layers_runs_lazily_with_cpus_tokens():
    """A sliding-window layer counts its positions in a Python int that a compiled replay
    would not advance (the decode step wrote past its window: an index error), and a
    prompt padded to a bucket would push the prompt out of the window. It runs as a
    dynamic cache does: lazily, recompiles counted, one warning naming the cause."""
    cpu, model = on_device(tiny_sliding_mistral)
    prompt = prompt_of(5, batch=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tokens, m = generate(model, prompt, new_tokens=10)
    assert torch.equal(tokens, generate(cpu, prompt, new_tokens=10)[0])
    assert m["step_captures"] == 0 and m["generate_device_loops"] == 0
    warned = [str(w.message) for w in caught if issubclass(w.category, RecompileWarning)]
    assert len(warned) == 1 and "sliding-window layers" in warned[0]


def tp_mesh():
    return torchspmd.Mesh(list(range(8)), (8,), ("model",))


@pytest.fixture(scope="module")
def llama_tp():
    cpu, model = cpu_and_copy(tiny_llama)
    model.eval().to(torchspmd.device())
    torchspmd.generation.parallelize_hf(model, tp_mesh())
    return cpu.eval(), torchspmd.generation.compile_generate(model)


@pytest.fixture(scope="module")
def gpt2_tp():
    # GPT-2's config has no TP plan and its Conv1D weights are (in, out): shard by hand.
    cpu, model = cpu_and_copy(tiny_gpt2)
    model.eval().to(torchspmd.device())
    mesh = tp_mesh()
    for block in model.transformer.h:
        for conv, spec in ((block.attn.c_attn, (None, "model")), (block.attn.c_proj, ("model", None)),
                           (block.mlp.c_fc, (None, "model")), (block.mlp.c_proj, ("model", None))):
            torchspmd.mark_sharding(conv.weight, mesh, spec)
    return cpu.eval(), torchspmd.generation.compile_generate(model)


@pytest.mark.parametrize("name", ["llama_tp", "gpt2_tp"])
@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
def test_tensor_parallel_generate_matches_cpu_with_two_programs(name, sample, request):
    cpu, model = request.getfixturevalue(name)
    prompt = prompt_of(5, batch=2)
    tokens, m = generate(model, prompt, sample=sample, seed=3)
    assert torch.equal(tokens, generate(cpu, prompt, sample=sample, seed=3)[0])
    assert_decode_programs(m)
    # greedy: its tokens picked on the device (``test_greedy_loop.py``)
    assert m["generate_device_loops"] == (0 if sample else 1)


def test_llama_tp_plan_shards_attention_and_mlp_over_model_axis(llama_tp):
    _, model = llama_tp
    layer = model.model.layers[0]
    assert torchspmd.get_sharding(layer.self_attn.q_proj.weight) == "{devices=[8,1]0,1,2,3,4,5,6,7}"
    assert torchspmd.get_sharding(layer.mlp.down_proj.weight) == "{devices=[1,8]0,1,2,3,4,5,6,7}"


def test_fsdp_sharded_weights_generate_cpu_tokens():
    from torchspmd.parallel.fsdp import SpmdFullyShardedDataParallel

    cpu, model = cpu_and_copy(tiny_llama)
    model.eval()
    SpmdFullyShardedDataParallel(model, mesh=torchspmd.Mesh(list(range(8)), (8,), ("fsdp",)))
    assert "devices=[" in torchspmd.get_sharding(model.model.layers[0].mlp.up_proj.weight)
    torchspmd.generation.compile_generate(model)
    prompt = prompt_of(5, batch=2)
    tokens, m = generate(model, prompt)
    assert torch.equal(tokens, generate(cpu.eval(), prompt)[0])
    assert_decode_programs(m)


def test_gpt2_has_no_hf_tp_plan_and_says_what_to_do():
    with pytest.raises(ValueError, match="no base_model_tp_plan.*parallelize_module"):
        torchspmd.generation.parallelize_hf(tiny_gpt2(), tp_mesh())


def test_prompt_bucket_longer_than_the_cache_would_be_gets_a_cache_that_holds_it():
    # 5 tokens pad to 32; 5 + 3 tokens alone would round to a cache of 8.
    cpu, model = on_device(tiny_llama, prompt_lengths=(4, 32), cache_multiple=8)
    prompt = prompt_of(5)
    tokens, m = generate(model, prompt, new_tokens=3)
    assert torch.equal(tokens, generate(cpu, prompt, new_tokens=3)[0])
    assert_decode_programs(m, 3)
    with torch.no_grad():
        out = model.generate(prompt.to(torchspmd.device()), max_new_tokens=3, do_sample=False,
                             cache_implementation="static", return_dict_in_generate=True)
    assert [layer.max_cache_len for layer in out.cache.layers] == [32, 32]


def test_a_model_on_the_cpu_generates_as_without_compile_generate():
    cpu, other = cpu_and_copy(tiny_llama)
    torchspmd.generation.compile_generate(other.eval())
    prompt = prompt_of(5)
    assert torch.equal(generate(other, prompt)[0], generate(cpu.eval(), prompt)[0])


def weight_copies(hlo: str, model) -> list[str]:
    """Lines of ``hlo`` that copy or transpose an array shaped like a Linear weight, transposed."""
    shapes = {f"f32[{i},{o}]" for m in model.modules() if isinstance(m, torch.nn.Linear)
              for o, i in [tuple(m.weight.shape)]}
    return [line for line in hlo.splitlines()
            if (" copy(" in line or " transpose(" in line) and any(s in line for s in shapes)]


def test_batch_one_decode_program_copies_no_weight(llama):
    # XLA:CPU copies W transposed for a batch-1 `x @ W.T` every call (next test); while
    # generating, Linears run as one einsum that contracts W in place.
    cpu, model = llama
    prompt = prompt_of(5)
    tokens, m = generate(model, prompt)
    assert torch.equal(tokens, generate(cpu, prompt)[0])
    generate(model, prompt, sample=True)  # generate's own loop: the plain decode step
    adaptation = model._torchspmd_generation
    for step in (adaptation.greedy.step, adaptation.decode):  # greedy's step, and that one
        assert weight_copies(step.optimized_hlo(), model) == []
    # only while generating: afterwards the Linears are as they were
    assert all("forward" not in m.__dict__ for m in model.modules() if isinstance(m, torch.nn.Linear))


def test_xla_cpu_still_copies_the_transposed_weight_of_a_batch_one_matmul():
    # Plain JAX: the reason for the einsum Linears above. When this fails, XLA:CPU folds the
    # transpose into the dot: drop _einsum_linears from torchspmd/generation/hf.py.
    import jax
    import jax.numpy as jnp

    x, w = jnp.zeros((1, 512), jnp.float32), jnp.zeros((1024, 512), jnp.float32)
    hlo = jax.jit(lambda x, w: x @ w.T).lower(x, w).compile().as_text()
    assert any(" copy(" in line and "f32[512,1024]" in line for line in hlo.splitlines())
