"""The differential fuzzer (issue 9 §6): random sharded programs must match CPU eager.

A bounded run of seeded programs is split across a few test ids so xdist spreads them;
``make fuzz`` runs thousands. The oracle and the outcome classification are tested on
programs written to fail in a known way.
"""

from __future__ import annotations

import pytest
import torch

import torchspmd
from torchspmd.testing.fuzz import generate, repro_script, run_program
from torchspmd.sharding import XLAShardedTensor
from torchspmd.testing.fuzz.oracle import check_shards, expected_sharding_text
from torchspmd.testing.fuzz.calls import CpuCalls, SpmdCalls, WrongOutcome
from torchspmd.testing.fuzz.runner import INTERNAL, OK, USER, WRONG, run_source

SEED = 20261125
CHUNKS = 4
PER_CHUNK = 12


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_random_programs_match_cpu_or_raise_a_clear_error(chunk):
    failures = []
    for index in range(chunk * PER_CHUNK, (chunk + 1) * PER_CHUNK):
        program = generate(SEED, index)
        outcome = run_program(program)
        if outcome.kind not in (OK, USER):
            failures.append(repro_script(program, outcome))
    assert not failures, "\n\n".join(failures)


def test_the_same_seed_and_index_give_the_same_program():
    assert generate(7, 3).source == generate(7, 3).source
    assert generate(7, 3).source != generate(7, 4).source


# What users' programs do around their ops, each of which the fuzzer must draw.
USER_ACTIONS = ("xs.read(", "for step in range(", "xs.manual(", "xs.checkpoint(", "xs.attempt(",
                "xs.out_of_memory()", "xs.conv_grads(", "xs.compile(", "opt.step()",
                "xs.settled(")


def test_programs_draw_every_user_action_and_grouped_convolutions():
    sources = [generate(SEED, index).source for index in range(120)]
    missing = [a for a in USER_ACTIONS if not any(a in source for source in sources)]
    assert not missing
    assert any("xs.conv_grads(" in s and ", 4, " in s for s in sources)  # groups=4


def test_a_step_captured_again_when_called_in_a_row_is_a_wrong_outcome():
    x = torch.ones(2, device=torchspmd.device())
    settled = torchspmd.compile(lambda t: t * 2)
    assert SpmdCalls.settled(lambda: settled(x)).cpu().tolist() == [2.0, 2.0]
    always = torchspmd.compile(lambda t: t * 2, check_every=1)  # captures on every call
    with pytest.raises(WrongOutcome, match="captured again on the third call"):
        SpmdCalls.settled(lambda: always(x))


def test_a_device_that_accepts_an_op_cpu_rejects_is_a_wrong_value():
    outcome = run_source(PROGRAM.format(
        extra="xs.attempt(lambda: t0 @ t0 if dev == 'cpu' else t0 + t0)"), False)
    assert (outcome.kind, outcome.subkind) == (WRONG, "outcome")


def test_an_out_of_memory_error_reaching_the_end_of_a_program_is_a_failure_that_spread():
    outcome = run_source(PROGRAM.format(
        extra="t1 = torch.ones(2**45, device=dev) if dev != 'cpu' else None; xs.sync()"), False)
    assert (outcome.kind, outcome.subkind) == (INTERNAL, "failure spread")


def test_a_repro_script_defines_the_program_and_replays_it():
    program = generate(7, 3)
    namespace: dict = {"__name__": "repro"}
    exec(repro_script(program, run_program(program)), namespace)
    assert "t0" in namespace["program"]("cpu", CpuCalls)


@pytest.mark.parametrize("ids, shape, names, spec, text", [
    (range(8), (2, 4), None, (0, None), "{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"),
    (range(8), (2, 4), None, (1, 0), "{devices=[4,2]0,4,1,5,2,6,3,7}"),
    ([2, 3], (1, 2), ("x", "y"), ("x", "y"), "{devices=[1,2]2,3}"),
    (range(8), (2, 2, 2), ("a", "b", "c"), (("a", "c"), None), "{devices=[4,1,2]0,2,1,3,4,6,5,7 last_tile_dim_replicate}"),
    (range(4), (4, 1), None, (None, 1), "{replicated}"),
    ([7, 1, 6, 0, 4, 2, 5, 3], (4, 2), None, (0,), "{devices=[4,2]1,7,0,6,2,4,3,5 last_tile_dim_replicate}"),
])
def test_oracle_sharding_text_follows_pytorch_xla(ids, shape, names, spec, text):
    assert expected_sharding_text(list(ids), shape, names, spec) == text


PROGRAM = """
def program(dev, xs):
    m0 = xs.Mesh([3, 1], (2,), ("a",))
    t0 = data((4, 3), torch.float32, 1).to(dev)
    xs.mark_sharding(t0, m0, ("a", None))
    {extra}
    return {{"t0": t0}}
"""


def test_a_program_that_matches_cpu_is_ok():
    assert run_source(PROGRAM.format(extra="t0.add_(1)"), mixes_device_sets=False).kind == OK


def test_a_value_that_differs_from_cpu_is_a_wrong_value():
    outcome = run_source(PROGRAM.format(extra="t0.add_(1 if dev == 'cpu' else 2)"), False)
    assert (outcome.kind, outcome.subkind) == (WRONG, "value")
    assert outcome.detail.startswith("t0:")


def test_a_bare_key_error_on_the_device_is_an_internal_error():
    outcome = run_source(PROGRAM.format(extra="{}['x'] if dev != 'cpu' else None"), False)
    assert outcome.kind == INTERNAL


@pytest.mark.parametrize("mixes, kind", [(True, USER), (False, INTERNAL)])
def test_a_mesh_mismatch_is_a_user_error_only_where_meshes_span_different_devices(mixes, kind):
    source = PROGRAM.format(extra="t1 = data((4, 3), torch.float32, 2).to(dev); "
                                  "xs.mark_sharding(t1, xs.Mesh([0, 2], (2,)), (0, None)); t0 = t0 + t1")
    assert run_source(source, mixes_device_sets=mixes).kind == kind


def test_local_shards_that_miss_a_region_are_caught():
    import torchspmd
    t = torch.arange(8.).to(torchspmd.device())
    torchspmd.mark_sharding(t, torchspmd.Mesh([0, 1], (2,)), (0,))
    shards = XLAShardedTensor(t).local_shards
    assert check_shards("t", shards, torch.arange(8.)) is None
    assert "uncovered" in check_shards("t", shards[:1], torch.arange(8.))


def test_a_job_whose_process_aborts_counts_a_process_abort_and_goes_on(tmp_path, monkeypatch):
    """XLA's CHECK failures kill the process: the parallel runner counts the program that
    died as a ``process abort``, writes its repro, and runs the programs after it."""
    from torchspmd.testing.fuzz.parallel import fuzz_in_processes
    from torchspmd.testing.fuzz.report import ABORT_AT
    from torchspmd.testing.fuzz.runner import ABORT

    monkeypatch.setenv(ABORT_AT, "1")
    counts = fuzz_in_processes(programs=3, seed=0, start=0, jobs=1, out_dir=str(tmp_path))
    assert counts[ABORT] == 1
    assert counts[OK] + counts[USER] == 2  # programs 0 and 2 ran
    assert (tmp_path / "seed0_1.py").exists()


def test_an_error_inside_a_checkpoint_save_is_classified_by_its_cause():
    """``torch.distributed.checkpoint`` wraps a planner's error in a ``CheckpointException``
    (a ``BaseException``); the fuzzer judges the error inside, and never lets it escape."""
    from torch.distributed.checkpoint.api import CheckpointException

    from torchspmd.runtime.placement import MeshMismatchError
    from torchspmd.testing.fuzz.runner import classify

    wrapped = CheckpointException("save failed", {0: (MeshMismatchError("two meshes"), None)})
    assert classify(wrapped, mixes_device_sets=True).kind == USER
    assert classify(CheckpointException("save failed", {0: (KeyError("k"), None)}), True).kind == INTERNAL


def test_a_drawn_op_whose_partner_would_be_too_large_is_skipped_not_raised():
    """Seed 0, program 3476: a view made a large tensor, and the partner an op drew for it
    would have been too large for a program; the generator skips that op."""
    program = generate(0, 3476)
    assert "def program" in program.source


def test_values_made_with_rounding_never_feed_whole_unit_ops():
    """A value made with rounding is not "exact" even where CPU's value is whole: CPU's
    bfloat16 log_softmax of [10, 4] is exactly [0, -6] where the float-accumulated value
    (the device's, and CUDA's) is [-0.0025, -6], and floor division turned that into a
    false "wrong value" (seed 4, program 531). Views of a value it changes follow it."""
    import random

    from torchspmd.testing.fuzz.generator import Builder

    b = Builder(random.Random(0))
    b.assign("torch.tensor([10.0, 4.0], dtype=torch.bfloat16)")  # t0
    b.assign("torch.log_softmax(t0, 0)")  # t1
    b.assign("t0[::1]")  # t2, a view of t0
    assert torch.equal(b.value("t1").float(), torch.tensor([0.0, -6.0]))  # whole, on CPU
    assert b.exact("t0") and b.exact("t2")
    assert not b.exact("t1")
    b.emit("t0.add_(t1)")  # t0 now carries t1's rounding, and so does its view
    assert not b.exact("t0") and not b.exact("t2")


def test_a_manual_regions_result_is_contiguous_on_both_sides():
    """Seed 45, program 142: the CPU side computed a manual region as ``t + 1``, which
    keeps a transposed input's strides, so ``flatten()`` copied there and was a view on the
    device (whose manual regions return contiguous tensors): a later write through the
    result showed up on one side only. Not a device bug: the reference now matches."""
    source = '''
import torch
from torchspmd.testing.fuzz.runner import data


def program(dev, xs):
    m0 = xs.Mesh([4, 6, 2, 0, 5, 3, 1, 7], (1, 4, 2), None)
    t3 = data((3, 8, 2), torch.float32, 11168).to(dev).transpose(2, 0)
    t6, l6 = xs.manual(t3, m0, (None, (1, 2), None), 'plus_one')
    t8 = t6.flatten()
    t6[1] = 1
    return {"t8": t8}
'''
    assert run_source(source, mixes_device_sets=False).kind == OK
