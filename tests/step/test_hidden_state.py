"""A tensor the step makes and leaves where the walk cannot see it (the global of a helper
function the step calls) would never be updated by a replay, which runs no Python: such
a capture is not kept, with a ``HiddenStateWarning``, and the next call captures again.
State made on first use is in place by then, and later calls replay. Before, the replays
computed from the capture's tensor: a buffer made on first use restarted from zeros on
every call (sums 3, 3, 3, 3 instead of 3, 6, 9, 12)."""

from __future__ import annotations

import warnings

import torch

import torchspmd as xs
from torchspmd.step import HiddenStateWarning

DEVICE = xs.device()
_STATE: dict = {}
_HISTORY: list = []


def _buffer():
    if "buffer" not in _STATE:
        _STATE["buffer"] = torch.zeros(3).to(DEVICE)
    return _STATE["buffer"]


def _remember(t):
    _HISTORY.append(t)


def test_state_a_helper_makes_on_first_use_is_in_place_for_the_next_capture():
    _STATE.clear()

    @xs.compile
    def step(x):
        buffer = _buffer()
        buffer.add_(x)
        return buffer.sum()

    before = xs.metrics()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sums = [step(torch.ones(3).to(DEVICE)).item() for _ in range(4)]
    after = xs.metrics()
    assert sums == [3.0, 6.0, 9.0, 12.0]
    assert _STATE["buffer"].cpu().tolist() == [4.0] * 3
    assert [w.category for w in caught].count(HiddenStateWarning) == 1
    assert after["step_hidden_state"] - before["step_hidden_state"] == 1
    assert after["step_replays"] - before["step_replays"] == 2


def test_a_tensor_a_helper_keeps_from_every_call_is_kept_from_every_call():
    _HISTORY.clear()

    @xs.compile
    def step(x):
        loss = (x * 2).sum()
        _remember(loss)
        return loss

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HiddenStateWarning)
        for i in range(3):
            step(torch.ones(3).to(DEVICE) * i)
    assert [t.item() for t in _HISTORY] == [0.0, 6.0, 12.0]


def test_a_step_that_leaves_nothing_behind_keeps_its_capture():
    model = torch.nn.Linear(3, 2).to(DEVICE)

    @xs.compile
    def step(x):
        return model(x).sum()

    before = xs.metrics()
    with warnings.catch_warnings():
        warnings.simplefilter("error", HiddenStateWarning)
        for _ in range(3):
            step(torch.ones(1, 3).to(DEVICE))
    assert xs.metrics()["step_replays"] - before["step_replays"] == 2


class _Holder:
    """An object torch's pytree cannot open (as Hugging Face's ``DynamicCache``)."""

    def __init__(self, t):
        self.t = t


def test_a_returned_object_holding_tensors_is_named_with_what_to_return_instead():
    @xs.compile
    def step(x):
        y = x * 2
        return y, _Holder(y + 1)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [step(torch.full((2,), float(i)).to(DEVICE)) for i in range(3)]
    messages = [str(w.message) for w in caught if w.category is HiddenStateWarning]
    assert messages and all("returned _Holder" in m and "use_cache=False" in m
                            for m in messages)
    assert [h.t.cpu().tolist() for _, h in outs] == [[1.0, 1.0], [3.0, 3.0], [5.0, 5.0]]
