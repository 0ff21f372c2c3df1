"""Default-on in-graph index checks (``device/index_checks.py``): an index out of range
raises an IndexError naming the op at the next sync() or host read (or after a
torchspmd.compile step) instead of XLA's clamped or dropped values; other tensors stay
readable; ``torchspmd.debug.index_checks(False)`` turns it off."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torchspmd

DEV = torchspmd.device()


def _t(values):
    return torch.tensor(values).to(DEV)


CASES = {  # op named in the error -> fn making its out-of-range call on the device
    "aten.gather": lambda: torch.gather(torch.ones(2, 3).to(DEV), 1, _t([[0, 3], [1, 2]])),
    "aten.index_select": lambda: torch.index_select(torch.ones(4, 2).to(DEV), 0, _t([1, 4])),
    "aten.index": lambda: torch.arange(5.).to(DEV)[_t([2, -6])],
    "aten.index_put": lambda: torch.zeros(5).to(DEV).index_put_((_t([5]),), _t([1.0])),
    "aten.scatter": lambda: torch.zeros(2, 3).to(DEV).scatter_(1, _t([[3]]), 1.0),
    "aten.embedding": lambda: F.embedding(_t([1, 128]), torch.ones(128, 4).to(DEV)),
    "aten.index_add": lambda: torch.zeros(3).to(DEV).index_add_(0, _t([3]), _t([1.0])),
    "aten.take": lambda: torch.take(torch.ones(2, 2).to(DEV), _t([4])),
}


@pytest.mark.parametrize("op", CASES)
def test_out_of_range_index_raises_at_the_next_read_naming_the_op(op):
    out = CASES[op]()
    with pytest.raises(IndexError, match=rf"{op}: index out of range .*TORCHSPMD_CHECK_INDICES=1"):
        out.cpu()


def test_sync_raises_once_the_program_is_done_and_other_tensors_stay_readable():
    before = torch.arange(3.).to(DEV) * 2
    torchspmd.sync()
    x = torch.arange(4.).to(DEV)
    good = x * 10
    bad = x[_t([4])]
    with pytest.raises(IndexError, match="aten.index: index out of range"):
        torchspmd.sync(wait=True)
    assert good.cpu().tolist() == [0, 10, 20, 30]
    assert before.cpu().tolist() == [0, 2, 4]
    assert (x + 1).cpu().tolist() == [1, 2, 3, 4]  # a new graph runs and reads
    bad.cpu()  # the error was raised once: the same values read without raising again


def test_indices_in_range_and_valid_negatives_do_not_raise():
    x = torch.arange(12.).reshape(3, 4).to(DEV)
    assert x[_t([-3, 2])].sum().item() == 44.0
    assert torch.take(x, _t([-1, 11])).cpu().tolist() == [11.0, 11.0]
    assert F.embedding(_t([0, 2]), x).cpu().tolist() == [[0, 1, 2, 3], [8, 9, 10, 11]]


def test_off_switch_gives_xlas_clamped_values_without_raising():
    previous = torchspmd.debug.index_checks(False)
    try:
        out = F.embedding(_t([1, 9]), torch.arange(8.).reshape(4, 2).to(DEV))
        assert out.cpu().shape == (2, 2)
    finally:
        torchspmd.debug.index_checks(previous)
    assert previous is True  # on by default


def test_embedding_id_beyond_the_vocabulary_raises_in_a_compiled_training_step():
    torch.manual_seed(0)
    emb = torch.nn.Embedding(16, 4).to(DEV)
    opt = torch.optim.SGD(emb.parameters(), lr=0.1)

    @torchspmd.compile
    def step(ids):
        loss = emb(ids).pow(2).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    for _ in range(2):  # captured, then replayed
        step(_t([1, 2])).item()
    with pytest.raises(IndexError, match="aten.embedding: index out of range .* torchspmd.compile step"):
        step(_t([1, 16])).item()
    assert torchspmd.metrics()["step_replays"] >= 2
    assert step(_t([3, 4])).item() > 0  # the next step runs, and the weights are readable
    assert emb.weight.cpu().isfinite().all()


def test_many_compiled_steps_in_flight_are_checked_without_running_anything_else():
    """A loop that launches steps ahead of its reads (a decode loop): each step's flag
    waits its turn; looking at them runs no program (flags compare by identity, not by a
    tensor ``==``), and a bad step among them still raises at the read."""
    table = torch.arange(32.).reshape(8, 4).to(DEV)
    state = torch.zeros(4).to(DEV)
    slow = torch.eye(384).to(DEV)  # a step the host launches faster than it runs

    @torchspmd.compile
    def step(ids):
        state.add_(F.embedding(ids, table).sum(0) + (slow @ slow @ slow).trace() * 0)

    good = _t([1, 2])
    for _ in range(3):  # captured, then replayed
        step(good)
    state.cpu()
    torchspmd.reset_metrics()
    for _ in range(20):
        step(good)
    assert torchspmd.metrics()["executions"] == 20
    expected = (3 + 20) * (table[1] + table[2]).cpu()
    assert torch.equal(state.cpu(), expected)
    with pytest.raises(IndexError, match="aten.embedding: index out of range"):
        for ids in ([1, 2], [1, 9], [1, 2]):
            step(_t(ids))  # raises at a later step once the bad one is done, or at the read
        state.cpu()


def test_flags_compare_by_identity_running_nothing():
    """Finding a flag in the list of watched ones must not compare tensors: that would run
    a program and read it in the middle of another check (it raised an internal
    ValueError from ``list.remove`` in a decode loop)."""
    from torchspmd.device.index_checks import _Flag

    a, b = torch.zeros((), dtype=torch.int32).to(DEV), torch.zeros((), dtype=torch.int32).to(DEV)
    torchspmd.sync()
    torchspmd.reset_metrics()
    assert _Flag(a, []) != _Flag(b, [])
    assert torchspmd.metrics()["executions"] == 0
