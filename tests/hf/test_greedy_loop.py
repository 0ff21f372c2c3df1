"""The greedy loop on the device (``torchspmd/generation/greedy.py``).

Greedy ``generate`` with a static cache picks every token after the first on the device:
one launch of one compiled step, a loop on the device that stops when every row has
finished or the tokens asked for are made, and one read of the tokens at the end. Its
tokens are ``generate``'s own on the CPU: where each row ends, what a minimum length
holds back, how long the result is. Every call it does not take runs ``generate``'s own
loop, with CPU's tokens too.
"""

import pytest
import torch

import torchspmd

from tests.hf.models import on_device, tiny_llama
from tests.hf.test_compiled_generate import prompt_of

NEW_TOKENS = 40


def left_padded(batch: int = 3, length: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    prompt = prompt_of(length, seed=13, batch=batch)
    mask = torch.ones_like(prompt)
    if batch > 1:
        mask[-1, :2] = 0
    return prompt, mask


def greedy(model, prompt, mask, new_tokens=NEW_TOKENS, **options):
    """Tokens of a ``generate`` (greedy unless ``options`` say otherwise), on the host, and
    the counters the call moved."""
    device = next(model.parameters()).device
    torchspmd.sync()
    torchspmd.reset_metrics()
    options = {"do_sample": False, **options}
    with torch.no_grad():
        out = model.generate(prompt.to(device), attention_mask=mask.to(device),
                             max_new_tokens=new_tokens, cache_implementation="static", **options)
    sequences = out.sequences if hasattr(out, "sequences") else out  # return_dict_in_generate
    return sequences.cpu(), torchspmd.metrics()


def assert_same_as_cpu(pair, prompt, mask, loops=1, **options):
    cpu, model = pair
    tokens, m = greedy(model, prompt, mask, **options)
    expected = greedy(cpu, prompt, mask, **options)[0]
    assert tokens.shape == expected.shape
    assert torch.equal(tokens, expected)
    assert m["generate_device_loops"] == loops
    return expected, m


@pytest.mark.parametrize("name,new_tokens", [("llama", NEW_TOKENS), ("gpt2", 24)])
def test_greedy_tokens_after_the_first_are_picked_on_the_device(name, new_tokens, request):
    # (GPT-2's 32 positions hold the prompt and 24 tokens)
    prompt, mask = left_padded()
    mask[:] = 1  # (a padded prompt's prefill runs one more small program: the mask's check)
    pair = request.getfixturevalue(name)
    for _ in range(2):  # the second call: every program compiled already
        _, m = assert_same_as_cpu(pair, prompt, mask, new_tokens=new_tokens,
                                  min_new_tokens=new_tokens)
    # the prefill, then one replayed step for every later token; no other program runs
    assert m["generate_device_tokens"] == new_tokens - 1
    assert m["step_replays"] == 1
    assert m["executions"] == 2


def end_token(pair, prompt, mask) -> int:
    """A token CPU's rows first make at three different steps: the first early, the last
    a few tokens before the end."""
    free = greedy(pair[0], prompt, mask, min_new_tokens=NEW_TOKENS)[0][:, prompt.shape[1]:]
    for token in sorted(set(free.flatten().tolist())):
        steps = [(row == token).nonzero()[0, 0].item() if (row == token).any() else None
                 for row in free]
        if None not in steps and len(set(steps)) == len(steps) \
                and min(steps) < 8 and 16 < max(steps) < NEW_TOKENS - 2:
            return token
    raise AssertionError(f"no such token in CPU's tokens {free.tolist()}")


def test_rows_end_where_cpus_rows_end_and_finished_rows_are_padded(llama):
    prompt, mask = left_padded()
    eos = end_token(llama, prompt, mask)
    expected, m = assert_same_as_cpu(llama, prompt, mask, eos_token_id=eos)
    # the loop stopped on the device at the token that ended the last row: none past it
    made = expected.shape[1] - prompt.shape[1]
    assert made < NEW_TOKENS
    assert m["generate_device_tokens"] == made - 1


def test_a_row_ending_on_the_first_token_is_padded_from_then_on(llama):
    prompt, mask = left_padded()
    first = greedy(llama[0], prompt, mask, new_tokens=1)[0][0, -1]
    assert_same_as_cpu(llama, prompt, mask, eos_token_id=int(first))


@pytest.mark.parametrize("minimum", [{"min_new_tokens": 12}, {"min_length": 15}])
def test_a_minimum_length_holds_the_end_back_on_the_device(llama, minimum):
    prompt, mask = left_padded()
    eos = end_token(llama, prompt, mask)
    expected, _ = assert_same_as_cpu(llama, prompt, mask, eos_token_id=eos, **minimum)
    free = assert_same_as_cpu(llama, prompt, mask, eos_token_id=eos)[0]
    assert not torch.equal(expected, free)  # the first row's early end was held back


def test_any_number_of_tokens_runs_the_one_compiled_step(llama):
    prompt, mask = left_padded()
    # compiled here or by an earlier test
    greedy(llama[1], prompt, mask, new_tokens=8, min_new_tokens=8)
    for new_tokens in (3, 17, 33):
        _, m = assert_same_as_cpu(llama, prompt, mask, new_tokens=new_tokens,
                                  min_new_tokens=new_tokens)
        assert m["graphs_compiled"] == 0
        assert m["step_captures"] == 0


class Streamer:
    def __init__(self):
        self.puts = 0

    def put(self, value):
        self.puts += 1

    def end(self):
        pass


@pytest.mark.parametrize("options", [
    {"repetition_penalty": 1.3},  # a logits processor that reads the ids
    {"streamer": "each token"},  # each token must reach the host as it is made
    {"return_dict_in_generate": True, "output_scores": True},
], ids=["processor", "streamer", "scores"])
def test_calls_the_loop_does_not_take_run_generates_own_loop(llama, options):
    prompt, mask = left_padded()
    streamer = options.get("streamer")
    cpu, model = llama
    if streamer:
        options = {"streamer": Streamer()}
    tokens, m = greedy(model, prompt[:1], mask[:1], new_tokens=6, **options)
    if streamer:
        assert options["streamer"].puts == 1 + 6  # the prompt, then each token
        options = {"streamer": Streamer()}
    assert torch.equal(tokens, greedy(cpu, prompt[:1], mask[:1], new_tokens=6, **options)[0])
    assert m["generate_device_loops"] == 0


def test_decode_inputs_the_loop_cannot_advance_run_generates_loop_from_there(llama, monkeypatch):
    from torchspmd.generation.greedy import GreedyLoop

    monkeypatch.setattr(GreedyLoop, "_advances", lambda self, inputs: False)
    prompt, mask = left_padded()
    eos = end_token(llama, prompt, mask)
    _, m = assert_same_as_cpu(llama, prompt, mask, new_tokens=6, eos_token_id=eos)
    assert m["generate_device_tokens"] == 0


def test_calls_of_every_kind_in_turn_each_give_cpus_tokens(llama):
    """A user's session: greedy, sampled and streamed calls in turn, batch sizes and
    prompt lengths changing, the greedy step's state (cache, buffers) never leaking from
    one call into the next."""
    cpu, model = llama
    calls = [({"batch": 3}, {}), ({"batch": 1}, {"do_sample": True}), ({"batch": 2}, {}),
             ({"batch": 1, "length": 9}, {"streamer": Streamer()}), ({"batch": 3}, {})]
    for shape, options in calls:
        prompt, mask = left_padded(**shape)
        torch.manual_seed(5)
        tokens, _ = greedy(model, prompt, mask, new_tokens=12, **options)
        if "streamer" in options:
            options = {"streamer": Streamer()}
        torch.manual_seed(5)
        assert torch.equal(tokens, greedy(cpu, prompt, mask, new_tokens=12, **options)[0])


def test_a_failed_call_leaves_the_next_one_cpus_tokens(gpt2):
    """GPT-2 has 32 positions: asking for more fails in the loop, with the index error
    naming the op; the next call generates as if nothing had happened."""
    cpu, model = gpt2
    prompt, mask = left_padded(batch=2)
    with pytest.raises(IndexError, match="index out of range"):
        greedy(model, prompt, mask, new_tokens=40, min_new_tokens=40)
    tokens, m = greedy(model, prompt, mask, new_tokens=10)
    assert torch.equal(tokens, greedy(cpu, prompt, mask, new_tokens=10)[0])
    assert m["generate_device_loops"] == 1


def test_weights_changed_between_calls_are_the_ones_the_loop_reads(llama):
    """The loop's program reads the model's weights as they are at each call (an RL or
    fine-tuning loop updates them in place between generations), never a copy taken when
    the loop was first compiled."""
    cpu, model = llama
    prompt, mask = left_padded()
    before = greedy(model, prompt, mask, new_tokens=12)[0]
    try:
        with torch.no_grad():
            for m in (cpu, model):
                m.model.layers[0].mlp.down_proj.weight.mul_(-3.0)
                m.lm_head.weight.add_(0.05)
        after, _ = assert_same_as_cpu(llama, prompt, mask, new_tokens=12)
        assert not torch.equal(after, before)
    finally:
        with torch.no_grad():
            for m in (cpu, model):
                m.lm_head.weight.sub_(0.05)
                m.model.layers[0].mlp.down_proj.weight.div_(-3.0)


def _reading_on_the_host(pair):
    """The pair with its first MLP reading a value on the host in every forward, as some
    models do (``if (mask == 0).any():``)."""
    for model in pair:
        mlp = model.model.layers[0].mlp
        forward = mlp.forward

        def reading(x, forward=forward):
            assert float(x.abs().max()) >= 0  # a host read
            return forward(x)

        mlp.forward = reading
    return pair


@pytest.mark.parametrize("options", [{}, {"do_sample": True}], ids=["greedy", "sampled"])
def test_a_model_that_reads_on_the_host_decodes_token_by_token_with_cpus_tokens(options):
    pair = _reading_on_the_host(on_device(tiny_llama))
    prompt, mask = left_padded()
    for _ in range(2):  # the second call goes straight to the token-by-token loop
        torch.manual_seed(4)
        tokens, m = greedy(pair[1], prompt, mask, new_tokens=6, **options)
        torch.manual_seed(4)
        assert torch.equal(tokens, greedy(pair[0], prompt, mask, new_tokens=6, **options)[0])
        assert m["generate_device_tokens"] == 0
