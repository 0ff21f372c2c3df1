"""examples/train_gpt.py: every strategy trains like CPU PyTorch; save/resume is exact."""

import itertools
import os
import sys

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from torchspmd.sharding import get_sharding

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
sys.path.insert(0, os.path.abspath(EXAMPLES))

import gpt  # noqa: E402  (found through the path insert above)
import train_gpt  # noqa: E402

SMALL = ["--dim", "32", "--layers", "1", "--heads", "4", "--batch", "8", "--seq", "16"]


def run(*extra: str, steps: int = 10) -> train_gpt.RunResult:
    return train_gpt.main([*SMALL, "--steps", str(steps), *extra])


# --- training on every strategy matches CPU ---------------------------------------------

@pytest.mark.parametrize("extra", [
    ["--strategy", "dp"],
    ["--strategy", "fsdp"],
    ["--strategy", "tp", "--untied"],
    ["--strategy", "fsdp+tp"],
    ["--strategy", "fsdp+tp", "--devices", "4,5,6,7"],
    ["--strategy", "auto"],
], ids=["dp", "fsdp", "tp-untied", "fsdp+tp", "fsdp+tp-submesh", "auto"])
def test_ten_steps_match_cpu_within_1e_4_and_compile_at_most_3_times(extra):
    result = run("--cpu-reference", *extra)
    assert len(result.losses) == 10
    np.testing.assert_allclose(result.losses, result.cpu_losses, rtol=1e-4)
    assert result.compiles <= train_gpt.MAX_COMPILES


def test_bf16_autocast_trains_like_cpu_autocast_and_compiles_at_most_3_times():
    result = run("--cpu-reference", "--autocast", "bf16", "--strategy", "fsdp+tp")
    np.testing.assert_allclose(result.losses, result.cpu_losses, rtol=2e-2)
    assert result.compiles <= train_gpt.MAX_COMPILES


# --- checkpoints -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A 6-step schedule stopped after step 3 and saved: (checkpoint dir, its losses)."""
    path = tmp_path_factory.mktemp("checkpoint")
    return path, run("--stop-at", "3", "--save", str(path), steps=6).losses


def test_resumed_run_continues_the_loss_curve_exactly(saved):
    path, first = saved
    second = run("--resume", str(path), steps=6).losses
    assert first + second == run(steps=6).losses


def test_checkpoint_holds_model_optimizer_step_and_rng(saved):
    stored = dcp.FileSystemReader(str(saved[0])).read_metadata().state_dict_metadata
    model = gpt.GPT(train_gpt.checkpoint_config(str(saved[0])))
    assert {f"model.{name}" for name in model.state_dict()} <= set(stored)
    assert {"step", "config", "rng.cpu", "rng.spmd"} <= set(stored)
    assert any(k.startswith("optimizer.state.") and k.endswith(".exp_avg_sq") for k in stored)
    state = {"step": 0}
    dcp.load(state, checkpoint_id=str(saved[0]), planner=DefaultLoadPlanner(allow_partial_load=True))
    assert state["step"] == 3


# --- the pieces ------------------------------------------------------------------------

def test_tied_head_stays_tied_on_the_device():
    model = gpt.GPT(gpt.GPTConfig(vocab=16, seq=8, dim=32, layers=1, heads=4))
    train_gpt.shard_model(model, train_gpt.build_mesh("4x2", None), "fsdp+tp")
    assert model.head.weight is model.tok.weight


def test_block_outputs_keep_the_batch_layout():
    mesh = train_gpt.build_mesh("4x2", None)
    model = gpt.GPT(gpt.GPTConfig(vocab=16, seq=8, dim=32, layers=1, heads=4))
    train_gpt.shard_model(model, mesh, "fsdp")
    train_gpt.shard_activations(model, mesh, "fsdp")
    logits = model(torch.zeros(8, 8, dtype=torch.long).to("spmd"))
    assert get_sharding(logits) == "{devices=[8,1,1]0,1,2,3,4,5,6,7}"  # batch over all 8


def test_megatron_specs_column_then_row():
    w_qkv, w_proj, b = torch.empty(96, 32), torch.empty(32, 32), torch.empty(96)
    assert gpt.param_spec("blocks.0.attn.qkv.weight", w_qkv, "tp") == ("model", None)
    assert gpt.param_spec("blocks.0.attn.qkv.bias", b, "tp") == ("model",)
    assert gpt.param_spec("blocks.0.attn.proj.weight", w_proj, "tp") == (None, "model")
    assert gpt.param_spec("blocks.0.mlp.down.bias", torch.empty(32), "tp") == (None,)


def test_fsdp_specs_split_the_largest_free_dim():
    up = torch.empty(128, 32)
    assert gpt.param_spec("blocks.0.mlp.up.weight", up, "fsdp") == (("data", "model"), None)
    assert gpt.param_spec("blocks.0.mlp.up.weight", up, "fsdp+tp") == ("model", "data")
    assert gpt.param_spec("tok.weight", torch.empty(40, 32), "dp") == (None, None)


def test_sub_mesh_from_device_ids():
    mesh = train_gpt.build_mesh(None, "4,5,6,7")
    assert mesh.mesh_shape == (2, 2) and mesh.device_ids.tolist() == [4, 5, 6, 7]


def test_learning_rate_warms_up_then_decays_to_a_tenth():
    lrs = [train_gpt.lr_at(s, 100, 1.0) for s in range(100)]
    assert lrs[0] < lrs[4] == pytest.approx(1.0)
    assert all(a >= b for a, b in itertools.pairwise(lrs[4:]))
    assert lrs[-1] == pytest.approx(0.1, abs=1e-3)


def test_batches_depend_only_on_the_step():
    tokens = torch.arange(500)
    whole = list(gpt.TokenBatches(tokens, batch=2, seq=8, steps=5, seed=3))
    resumed = list(gpt.TokenBatches(tokens, batch=2, seq=8, steps=5, seed=3, start=2))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(whole[2:], resumed))


def test_corpus_is_deterministic_and_tokenizes_round_trip():
    corpus = gpt.make_corpus(2_000, seed=0)
    assert corpus == gpt.make_corpus(2_000, seed=0) and len(corpus) >= 2_000
    tok = gpt.CharTokenizer(corpus)
    assert tok.decode(tok.encode(corpus)) == corpus and tok.vocab_size % 8 == 0
