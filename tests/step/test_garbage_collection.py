"""Python's garbage collector during a compiled step: a call never starts a collection
(one in the middle of a large replay would delay its launch); what the call's
allocations are due comes after it returns, in the caller's code. The collector is left
as the caller had it, also when the call raises. And a training loop of replays, at
Python's default thresholds, is due no collection at all: each call frees what the last
one consumed after making its own new arrays, so the count of containers that triggers
a collection (which never goes below zero) does not grow from step to step, however
many tensors the step updates. (It grew by ~900 per step at 150 parameters: a young
collection every step, and every ~400 steps a full one of ~250 ms.)"""

import contextlib
import gc

import pytest
import torch

import torchspmd as xs
from tests.step.helpers import DEVICE, batches, mlp, on_device, train_step


@contextlib.contextmanager
def collections_started(threshold: int | None = None):
    """The generations of the collections that start inside the block; with
    ``threshold``, the collector's first threshold meanwhile."""
    started = []

    def note(phase, info):
        if phase == "start":
            started.append(info["generation"])

    saved = gc.get_threshold()
    gc.callbacks.append(note)
    if threshold is not None:
        gc.set_threshold(threshold)
    try:
        yield started
    finally:
        gc.set_threshold(*saved)
        gc.callbacks.remove(note)


@pytest.fixture
def collections():
    """The collections that start while the test runs, and a collector that starts one at
    every container made (a threshold of 1), so that any allocation would collect."""
    with collections_started(threshold=1) as started:
        yield started


def _step_and_data(steps: int = 3):
    model = mlp(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    return xs.compile(train_step(model, opt)), [on_device(x, y) for x, y in batches(steps)]


def test_no_collection_starts_during_a_replay_and_one_can_start_after_it(collections):
    step, data = _step_and_data()
    for x, y in data[:2]:  # capture, then a first replay
        step(x, y)
    replays = xs.metrics()["step_replays"]
    collections.clear()
    loss = step(*data[2])
    during = len(collections)  # an int: no container made, so no collection yet
    assert during == 0
    assert gc.isenabled()
    made = [[] for _ in range(3)]  # the caller's next containers start one
    assert len(collections) > 0 and made
    assert xs.metrics()["step_replays"] == replays + 1
    assert torch.isfinite(loss.cpu())


@pytest.mark.parametrize("read_every", [1, 4])
def test_a_loop_of_replays_is_due_no_collection(read_every):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(80)]).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)  # 160 parameters: ~800 arrays
    step = xs.compile(train_step(model, opt))
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(8, 4, generator=g), torch.randn(8, 4, generator=g)) for _ in range(34)]
    for x, y in data[:4]:  # capture, first replays
        step(*on_device(x, y)).item()
    assert gc.get_threshold()[0] == 700  # Python's default
    replays = xs.metrics()["step_replays"]
    gc.collect()
    with collections_started() as started:
        for i, (x, y) in enumerate(data[4:]):  # the usual loop: each batch uploaded in it
            loss = step(*on_device(x, y))
            if i % read_every == read_every - 1:
                assert torch.isfinite(loss.cpu())
    assert xs.metrics()["step_replays"] == replays + 30
    assert started == []


def test_a_collector_the_caller_disabled_stays_disabled():
    step, data = _step_and_data()
    gc.disable()
    try:
        for x, y in data:
            step(x, y)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_collector_is_enabled_again_after_a_call_that_raises():
    def broken(x):
        raise ValueError("the step's own error")

    step = xs.compile(broken)
    with pytest.raises(ValueError, match="the step's own error"):
        step(torch.ones(2, device="spmd"))
    assert gc.isenabled()
