"""``torchspmd.compile``: run a training step's Python once, then replay it as one call.

Semantics are ``jax.jit``'s: the Python runs while a call is captured, and afterwards only
when the argument signature changes (``signature.py``), a hand-set hyperparameter
changes, or a ``check_every`` check comes due. State is discovered, not declared: every
tensor the step reads is an input, every tensor it writes or creates is written back into
the same Python object or slot after each call.

Example::

    @torchspmd.compile
    def train_step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    for x, y in loader:
        loss = train_step(x, y)   # after capture: one jitted call, no Python per op
        sched.step()
"""

from __future__ import annotations

import functools
import gc
import types
import warnings
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_map

from torchspmd.device import index_checks
from torchspmd.device.tensor import SpmdTensor
from torchspmd.lazy.handle import Handle
from torchspmd.runtime import execute, hooks
from torchspmd.runtime.cache import LRU
from torchspmd.runtime.metrics import COUNTERS
from torchspmd.runtime.user_code import user_stacklevel
from torchspmd.step import optim
from torchspmd.step.arguments import flatten, unflatten
from torchspmd.step.capture import capture, first_difference, hidden_tensors
from torchspmd.step.plan import Plan, StalePlan
from torchspmd.step.signature import signature
from torchspmd.step.value_changes import ValueWatch


# Plans kept per argument signature, for states the step meets in turn (``p.grad`` empty
# on the first micro-batch of an accumulation, full on the others).
_PLANS_PER_SIGNATURE = 4


class CheckMissError(RuntimeError):
    """A ``check_every`` re-recording of a compiled step took another path than its capture."""


class CompiledStep:
    """A step function compiled by :func:`compile` (call it like the function)."""

    def __init__(self, fn: Callable, check_every: int | None = None, cache_size: int = 64):
        if not callable(fn):
            raise TypeError(f"torchspmd.compile: expected the step function, got {fn!r} (use it "
                            "as @torchspmd.compile or torchspmd.compile(step))")
        if check_every is not None and (isinstance(check_every, bool) or
                                        not isinstance(check_every, int) or check_every < 1):
            raise ValueError(f"torchspmd.compile: check_every must be an int >= 1 or None, got "
                             f"{check_every!r}")
        self.fn = fn
        # A functools.partial's bound arguments are arguments of each call: the state
        # they hold (a model, an optimizer) is found through them, as through any argument.
        self._target, self._bound = ((fn.func, (fn.args, fn.keywords))
                                     if isinstance(fn, functools.partial) else (fn, None))
        self.check_every = check_every
        self._plans = LRU(cache_size)
        self._calls = 0
        self._last: Plan | None = None
        # The optimizers of every plan captured: a call lends their groups device
        # learning rates and gives the users' own back at its end (``optim.give_back``).
        self._lenders: list = []
        self._warned_autograd = False
        self._values = ValueWatch()
        functools.update_wrapper(self, fn)

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        """``@torchspmd.compile`` on a method: ``trainer.step(x)`` calls it with ``trainer``
        first, as a plain function's method binding does (and as ``torch.compile`` and
        ``jax.jit`` allow). Each instance is an argument: its state is found through it."""
        return self if instance is None else types.MethodType(self, instance)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._calls += 1
        # Python's garbage collector waits until the call returns. A replay makes a few
        # containers per state tensor (new values, the program's output arrays): with
        # 150 parameters, enough to start a collection (0.5 ms) in the middle of the
        # call, before the launch. After the return it runs in the caller's code, while
        # the devices compute.
        if self._bound is not None:
            args, kwargs = (*self._bound[0], *args), {**self._bound[1], **kwargs}
        collecting = gc.isenabled()
        gc.disable()
        try:
            args, kwargs, flat, views = _as_bases(args, kwargs)
            result = self._run(args, kwargs, flat)
            for view, copy, version in views:
                if copy.handle.storage.version != version:  # the step wrote into the argument
                    with torch.no_grad():
                        view.copy_(copy)
            return result
        finally:
            optim.give_back(self._lenders)
            if collecting:
                gc.enable()

    def _run(self, args: tuple, kwargs: dict, flat: tuple) -> Any:
        key, tensors = signature(args, kwargs, flat)
        plans: list[Plan] = self._plans.get(key) or []
        plan = next((p for p in plans if p.ready()), None)
        if plan is None and plans:
            COUNTERS["step_recaptures_state"] += 1  # e.g. p.grad set to None outside
        elif not plans:
            self._values.new_signature(getattr(self._target, "__name__", "the step"), flat[0])
        if plan is not None:
            reason = self._why_capture(plan)
            if reason is None:
                try:
                    run = plan(tensors)
                except StalePlan:
                    reason = "state"
                else:
                    COUNTERS["step_replays"] += 1
                    self._last = plan
                    return _checked(plan.write_back(run), plan.captured)
            COUNTERS[f"step_recaptures_{reason}"] += 1
        return self._capture(key, plan, args, kwargs, tensors)

    def _why_capture(self, plan: Plan) -> str | None:
        if optim.hyperparameters(plan.captured.optimizers) != plan.captured.hyper:
            return "hyperparameters"
        if self.check_every is not None and self._calls % self.check_every == 0:
            return "check"
        return None

    def _capture(self, key, old: Plan | None, args, kwargs, tensors) -> Any:
        result, captured, undo = capture(self._target, args, kwargs, tensors)
        watched = result
        self._lenders += [o for o in captured.optimizers
                          if not any(o is known for known in self._lenders)]
        COUNTERS["step_captures"] += 1
        # A module compiled the way ``torch.compile(model)`` is used: the caller means to
        # call backward on its results (a function's forward-only use is left alone).
        if (captured.autograd_expected and isinstance(self.fn, torch.nn.Module)
                and not self._warned_autograd):
            self._warned_autograd = True
            _warn_no_autograd(self.fn)
        if old is not None and captured.graph is not None and old.key != captured.graph.key \
                and self.check_every is not None and self._calls % self.check_every == 0:
            COUNTERS["step_check_misses"] += 1
            raise CheckMissError(
                "torchspmd.compile: check_every found that the step now runs another "
                "computation than the one captured "
                f"({first_difference(old.captured.graph, captured.graph)}). The Python code "
                "took another path (it depends on a value that changed): make the step's "
                "path depend only on its arguments, or pass the value that changes as an "
                "argument.")
        if captured.warmup or captured.graph is None:
            COUNTERS["step_warmups"] += 1
            # Ran lazily: the values are pending, as on the lazy path (results with an
            # autograd history detached, as a replay's are; a parameter or gradient the
            # step returns is returned itself, as a replay returns it).
            return _checked(tree_map(lambda t: t.detach() if isinstance(t, SpmdTensor)
                                     and t.grad_fn is not None else t, watched), captured)
        try:
            plan = Plan(captured)
            run = plan(tensors, first=True)
        except BaseException:
            # The step did not happen: its state keeps the values it had before the call
            # (a later call captures it again).
            undo.apply()
            raise
        # Written back as a replay writes: the recorded nodes stay pending for anything
        # else that still holds them (a later sync computes those lazily).
        out = plan.write_back(run)
        del result, watched, run  # the capture's own tensors: only hidden holders remain
        hidden = hidden_tensors(captured)
        if hidden:
            COUNTERS["step_hidden_state"] += 1
            _warn_hidden(hidden, captured)
        else:
            plans = [p for p in (self._plans.get(key) or []) if p is not old]
            self._plans[key] = [plan] + plans[:_PLANS_PER_SIGNATURE - 1]
        self._last = plan
        return _checked(out, captured)

    @property
    def plans(self) -> int:
        """How many argument signatures have a captured plan."""
        return len(self._plans)

    def optimized_hlo(self) -> str | None:
        """XLA's optimized HLO of the program the latest call ran (None before any).

        Example: ``torchspmd.debug.collectives(step.optimized_hlo())``.
        """
        return self._last.compiled.as_text() if self._last is not None else None

    def memory_analysis(self):
        """XLA's memory analysis of the program the latest call ran (None before any).

        Example: ``step.memory_analysis().temp_size_in_bytes``.
        """
        return self._last.memory if self._last is not None else None


class HiddenStateWarning(UserWarning):
    """A compiled step left tensors it made where no replay would update them."""


class NoAutogradWarning(UserWarning):
    """A compiled module returns tensors with autograd history but runs no backward."""


def _warn_no_autograd(fn) -> None:
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    warnings.warn(
        f"torchspmd.compile: {name} returns tensors with autograd history and runs no "
        "backward. A compiled function is a whole step: its results have no autograd "
        "history, so .backward() on them raises 'element 0 of tensors does not require "
        "grad'. Compile the training step (forward, loss.backward() and optimizer.step() "
        "inside), or run the model without torchspmd.compile (the lazy device records the "
        "backward too). For evaluation, torch.no_grad() in the function silences this.",
        NoAutogradWarning, stacklevel=user_stacklevel())


def _warn_hidden(count: int, captured) -> None:
    opaque = sorted({type(r).__name__ for r in captured.result_leaves
                     if r is not None and not isinstance(r, _PLAIN_RESULTS)})
    where = (f"The step returned {', '.join(opaque)}, which a compiled step returns as the "
             "first call made it, with the tensors it held then: return the tensors "
             "themselves, in tuples, lists, dicts, named tuples, mappings or dataclasses "
             "(for a Hugging Face model, pass use_cache=False or return outputs.loss and "
             "outputs.logits). ") if opaque else ""
    warnings.warn(
        f"torchspmd.compile: the step left {count} tensor(s) it made where a compiled step "
        "cannot find them (not reachable from its arguments, closure or globals within "
        "the walk's limits: e.g. the global of a helper function it calls). A replay runs "
        "no Python and would never update them, so this capture is not kept: the next call "
        f"captures again, and replays once such state exists before the call. {where}Keep "
        "state the step creates in a module, an optimizer, or an object the step names "
        "itself.", HiddenStateWarning, stacklevel=user_stacklevel())


# Results a replay returns as they are, holding no tensor.
_PLAIN_RESULTS = (int, float, bool, complex, str, bytes, torch.dtype, torch.device, type)


def _checked(result_and_flag: tuple, captured) -> Any:
    """The step's result; its index-range flag is read after a later run (or this one's,
    if it is done by then) and raises there (``device/index_checks.py``)."""
    result, flag = result_and_flag
    if flag is not None:
        index_checks.watch_tensor(flag, captured.index_messages, "a torchspmd.compile step")
    hooks.after_run(blocking=False)
    return result


def _as_bases(args: tuple, kwargs: dict) -> tuple[tuple, dict, tuple, list]:
    """The arguments with every spmd tensor holding data, views replaced by plain copies
    (a view's chain is part of the program; its data is what the step reads); their
    leaves and structure (``arguments.flatten``); and per copy ``(view, copy, the copy's
    storage version)``, for what the step writes into it to go back into the view."""
    leaves, spec = flatten((args, kwargs))
    values = [t.handle.value() for t in leaves if isinstance(t, SpmdTensor)]
    pending = [v for v in values if v[0].arrays is None]
    if pending:
        execute.materialize(pending)
    if not any(_partial_view(t) for t in leaves):
        return args, kwargs, (leaves, spec), []
    views = []
    for k, t in enumerate(leaves):
        if _partial_view(t):
            copy = SpmdTensor(Handle.new(t.handle.value(), t.handle.meta),
                              requires_grad=t.requires_grad)
            views.append((t, copy, copy.handle.storage.version))
            leaves[k] = copy
    return *unflatten(leaves, spec), (leaves, spec), views


def _partial_view(t) -> bool:
    """Whether ``t`` is an spmd tensor viewing part of its storage (``Handle.whole``: an
    ``nn.Parameter``'s identity chain reads the storage itself)."""
    return isinstance(t, SpmdTensor) and not t.handle.whole


def compile(fn: Callable | None = None, *, check_every: int | None = None) -> Any:
    """Compile a training step: capture its Python once, then run one program per call.

    ``check_every=N`` re-records every N-th call and raises :class:`CheckMissError` naming
    the first op that differs if the Python took another path. See the module docstring
    for the contract; ``torchspmd.metrics()`` counts ``step_captures``, ``step_replays``,
    ``step_warmups``, ``step_recaptures_<reason>``, ``step_check_misses`` and
    ``donated_bytes``.

    Example::

        step = torchspmd.compile(train_step)          # or @torchspmd.compile
        loss = step(x, y)
    """
    if fn is None:
        return functools.partial(compile, check_every=check_every)
    return CompiledStep(fn, check_every)
