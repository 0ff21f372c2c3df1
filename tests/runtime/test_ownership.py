"""Buffer ownership (``torchspmd/runtime/ownership.py``): a buffer that anyone else can still
read is never donated, on any path — the lazy ``sync()`` of an in-place update, a compiled
step's parameters and optimizer state, a compiled step's recycled gradients, and arrays
that lend their buffers to another (sub-mesh) array. Whoever holds it, and however
(a Python name, a weak reference, autograd's saved tensors, a view, a ``detach()``, a list
or dict, a closure), reads afterwards what CPU PyTorch reads, and nobody ever sees
"Array has been deleted". With no other holder, each path donates.

Ownership is read from reference counts only after a self-test at import has shown that
this interpreter counts them as expected. An interpreter whose counts are shifted
evenly (its stack borrows a reference) is calibrated; one that counts some objects
differently fails the self-test: donation is then off, and each refusal is counted in
``metrics()["donation_disabled"]``.
"""

from __future__ import annotations

import sys
import weakref

import pytest
import torch

import torchspmd as xs
from torchspmd.runtime import ownership, ownership_check
from tests.step.helpers import DEVICE, batches, mlp, train_step


def _hide(kind: str, t: torch.Tensor):
    """``t`` held by ``kind`` of holder (and nothing else of the caller's)."""
    if kind == "python reference":
        return t
    if kind == "weak reference":
        return weakref.ref(t)
    if kind == "autograd":  # saved for backward: a C++ holder
        return t * torch.ones(t.shape, device=t.device, requires_grad=True)
    if kind == "view":
        return t[0]
    if kind == "detach":
        return t.detach()
    if kind == "list":
        return [t]
    if kind == "dict":
        return {"t": t}
    if kind == "closure":
        return lambda: t
    raise AssertionError(kind)


def _read(kind: str, held) -> torch.Tensor | None:
    """What the holder shows now, on the host (None: the tensor is gone)."""
    t = {"weak reference": lambda: held(), "autograd": lambda: held.grad_fn._saved_self,
         "list": lambda: held[0], "dict": lambda: held["t"],
         "closure": lambda: held()}.get(kind, lambda: held)()
    return None if t is None else t.detach().cpu()


def _same(got, expected) -> None:
    assert (got is None) == (expected is None)
    if expected is not None:
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def _donated() -> float:
    return xs.metrics()["donated_bytes"]


HOLDERS = ["python reference", "weak reference", "autograd", "view", "detach", "list", "dict",
           "closure"]


@pytest.fixture
def counting(request):
    """Ownership calibrated for the interpreter named by ``request.param``: this one, or one
    whose reference counts are all one lower (a stack that borrows the argument)."""
    real = ownership._getrefcount
    if request.param == "one lower":
        ownership._getrefcount = lambda x: real(x) - 2  # - 1 for this lambda's own argument
    try:
        assert ownership_check.calibrate().ok
        yield request.param
    finally:
        ownership._getrefcount = real
        ownership_check.calibrate()


INTERPRETERS = pytest.mark.parametrize("counting", ["this interpreter", "one lower"],
                                       indirect=True)


# --- lazy sync: an in-place update of a tensor whose buffer a copy_ target shares ----------

def _lazy_update(device, kind: str, hold: bool = True):
    p = torch.arange(6.0).reshape(3, 2).to(device) + 1
    xs.sync()
    target = torch.empty(3, 2, device=device)
    target.copy_(p)  # on the spmd device: shares p's buffer, no data moves
    xs.sync()
    held = _hide(kind, target) if hold else None
    del target
    before = _donated()
    p.mul_(3)
    xs.sync()
    return _read(kind, held) if hold else None, p.cpu(), _donated() - before


@INTERPRETERS
@pytest.mark.parametrize("kind", HOLDERS)
def test_a_lazy_update_never_donates_a_buffer_a_holder_still_reads(kind, counting):
    got, p, _ = _lazy_update(DEVICE, kind)
    expected, p_cpu, _ = _lazy_update("cpu", kind)
    _same(got, expected)
    torch.testing.assert_close(p, p_cpu)


@INTERPRETERS
def test_a_lazy_update_with_no_other_holder_donates(counting):
    _, p, donated = _lazy_update(DEVICE, "python reference", hold=False)
    assert donated == 6 * 4
    torch.testing.assert_close(p, 3 * (torch.arange(6.0).reshape(3, 2) + 1))


# --- compiled steps: parameters and optimizer state, and recycled gradients -----------------

def _model_and_step(device):
    model = mlp(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = train_step(model, opt)
    return model, opt, (xs.compile(step) if device != "cpu" else step)


def _steps(device, hide_after_two):
    """Four steps; after two, ``hide_after_two(model, opt)`` plants a holder. Returns what
    it returned, the final weights, and the bytes donated by the last two steps."""
    model, opt, step = _model_and_step(device)
    data = batches(4)
    for x, y in data[:2]:
        step(x.to(device), y.to(device))
    held = hide_after_two(model, opt)
    before = _donated()
    for x, y in data[2:]:
        step(x.to(device), y.to(device))
    return held, [p.detach().cpu() for p in model.parameters()], _donated() - before


def _copy_of_state(kind):
    """A holder of a zero-copy ``copy_`` of the first weight and of its momentum."""
    def plant(model, opt):
        weight = model[0].weight
        alias = torch.empty_like(weight)
        alias.copy_(weight.detach())
        moment = torch.empty_like(weight)
        moment.copy_(opt.state[weight]["momentum_buffer"])
        xs.sync()
        return _hide(kind, alias), _hide(kind, moment)
    return plant


@INTERPRETERS
@pytest.mark.parametrize("kind", HOLDERS)
def test_a_compiled_step_never_donates_state_a_holder_still_reads(kind, counting):
    held, weights, _ = _steps(DEVICE, _copy_of_state(kind))
    held_cpu, weights_cpu, _ = _steps("cpu", _copy_of_state(kind))
    for got, expected in zip(held, held_cpu):
        _same(_read(kind, got), _read(kind, expected))
    for got, expected in zip(weights, weights_cpu):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@INTERPRETERS
@pytest.mark.parametrize("kind", HOLDERS)
def test_a_compiled_step_never_recycles_a_gradient_a_holder_still_reads(kind, counting):
    def plant(model, opt):
        return _hide(kind, model[0].weight.grad)

    held, weights, _ = _steps(DEVICE, plant)
    held_cpu, weights_cpu, _ = _steps("cpu", plant)
    _same(_read(kind, held), _read(kind, held_cpu))
    for got, expected in zip(weights, weights_cpu):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@INTERPRETERS
def test_a_compiled_step_with_no_other_holder_donates_state_and_recycles_gradients(counting):
    _, weights, donated = _steps(DEVICE, lambda model, opt: None)
    state = sum(w.numel() * 4 for w in weights)
    # Per step: parameters, momentum buffers, and the old gradients.
    assert donated == 2 * 3 * state


# --- aliases: an array lending its buffers to a sub-mesh array ------------------------------

def _lent(device, kind: str, hold: bool = True):
    source = torch.arange(4.0).to(device) + 1  # replicated on every device
    xs.sync()
    target = torch.empty(4, device=device)
    target.copy_(source)
    if device != "cpu":  # lends source's buffers on devices 0 and 1, no data moves
        xs.mark_sharding(target, xs.Mesh([0, 1], (2,), ("x",)), (None,))
    xs.sync()
    held = _hide(kind, target) if hold else None
    del target
    before = _donated()
    source.add_(1)
    xs.sync()
    return _read(kind, held) if hold else None, source.cpu(), _donated() - before


@INTERPRETERS
@pytest.mark.parametrize("kind", HOLDERS)
def test_buffers_lent_to_a_sub_mesh_array_a_holder_reads_are_never_donated(kind, counting):
    got, source, _ = _lent(DEVICE, kind)
    expected, source_cpu, _ = _lent("cpu", kind)
    _same(got, expected)
    torch.testing.assert_close(source, source_cpu)


@INTERPRETERS
def test_buffers_once_lent_are_donated_when_the_borrower_is_gone(counting):
    _, source, donated = _lent(DEVICE, "python reference", hold=False)
    assert donated == 4 * 4
    torch.testing.assert_close(source, torch.arange(4.0) + 2)


# --- an interpreter that fails the self-test ------------------------------------------------

@pytest.fixture
def uneven_counts():
    """Reference counts one lower for tuples only (a stack borrowing some loads), so the
    self-test fails and donation is off."""
    real = ownership._getrefcount
    ownership._getrefcount = lambda x: real(x) - 1 - (type(x) is tuple)
    try:
        yield ownership_check.calibrate()
    finally:
        ownership._getrefcount = real
        ownership_check.calibrate()


def test_counts_that_fail_the_self_test_turn_donation_off_and_say_why(uneven_counts):
    assert not uneven_counts.ok
    assert "donation is off" in uneven_counts.reason
    assert f"{sys.version_info.major}.{sys.version_info.minor}" in uneven_counts.reason


def test_with_donation_off_nothing_is_donated_each_refusal_is_counted_and_values_match_cpu(
        uneven_counts):
    disabled = xs.metrics()["donation_disabled"]
    _, p, donated_lazy = _lazy_update(DEVICE, "python reference", hold=False)
    _, weights, donated_steps = _steps(DEVICE, lambda model, opt: None)
    _, p_cpu, _ = _lazy_update("cpu", "python reference", hold=False)
    _, weights_cpu, _ = _steps("cpu", lambda model, opt: None)
    assert donated_lazy == 0 and donated_steps == 0
    # At least: the lazy update's sync, and per compiled call its state and each gradient.
    assert xs.metrics()["donation_disabled"] - disabled >= 1 + 2 * (1 + 2)
    torch.testing.assert_close(p, p_cpu)
    for got, expected in zip(weights, weights_cpu):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
