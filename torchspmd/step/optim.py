"""Optimizers made replayable: step counters on the device, learning rates as device scalars.

``torch.optim`` defaults keep Adam's step counter on the CPU and read it with ``.item()``,
a host read a compiled step cannot do. With ``capturable=True`` (which PyTorch offers for
exactly this: CUDA graphs) the counter lives on the device. Adam's learning rate is a
0-d device tensor while a call runs: :func:`prepare` writes the group's float into it
and lends it to the group, :func:`give_back` puts the float back when the call is over,
so a schedule changes a program *input* (no re-capture, no recompile) while between
calls the group holds the user's number, as on CPU.

Optimizers that take a tensor learning rate only through a host read (``SGD``'s
``alpha=-lr``) keep Python numbers; :func:`hyperparameters` lists them, and a change
makes the step re-capture (the recorded graph is the same, so its program is reused).

Step counters on the device are float64 (PyTorch's capturable ones are float32). Without
``capturable``, PyTorch reads the count as a Python float and computes Adam's bias
corrections in double precision; ``1 - 0.999 ** step`` in float32 is off by 1.3e-5
(relative) at step 1 and by ~1e-5 for the first few thousand steps, so a float32 counter
moved every update by ~6e-6 against CPU's (float64 parameters by as much). A float64
counter computes those expressions as CPU does. ``state_dict()`` holds the counters
themselves (a checkpoint loaded in place must reach them), float64; a CPU optimizer
loads them as they are, and a capturable one as float32.

Example::

    prepare([opt])         # Adam: capturable, lr lent a device scalar; Adagrad: step on device
    give_back([opt])       # after the call: the group's own float lr again
    hyperparameters([opt]) # ((0, "momentum", 0.9), ...) for the others
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from torchspmd.device.tensor import DEVICE
from torchspmd.sharding.state import new_leaf

# Python numbers: a step reads them as constants (a hyperparameter, a global).
NUMBERS = (float, int, bool, complex)
# Optimizers whose tensor learning rate is used by tensor ops only (with capturable=True).
_TENSOR_LR = (torch.optim.Adam, torch.optim.AdamW)
# Optimizers with no capturable option that keep their step count on the CPU and read it
# through ``_get_value``, which keeps a device tensor a tensor while a step is captured
# (``torch.compiler.is_compiling()`` is true then): their counts move to the device.
_STEP_ON_DEVICE = (torch.optim.Adagrad,)


def prepare(optimizers: list[torch.optim.Optimizer], capturing: bool = False) -> None:
    """Make ``optimizers`` replayable in place (see the module docstring). Idempotent; a
    float learning rate set by hand since the last call is copied into the device scalar.
    ``capturing``: also move the step counts of ``_STEP_ON_DEVICE`` optimizers, which a
    replay need not look at again (a count put back on the CPU leaves the slot holding
    another tensor than the plan read: the step is captured again, and moved then)."""
    for opt in optimizers:
        tensor_lr = isinstance(opt, _TENSOR_LR)
        if "_torchspmd_capturable" not in opt.__dict__:
            # Checkpoints keep the optimizer's own settings: a float lr, capturable as set.
            opt.__dict__["_torchspmd_capturable"] = {}
            opt.register_state_dict_post_hook(_portable_state_dict)
        for i, group in enumerate(opt.param_groups):
            if "capturable" in group and not group["capturable"]:
                opt.__dict__["_torchspmd_capturable"][i] = False
                group["capturable"] = True
            if capturing and ("capturable" in group or isinstance(opt, _STEP_ON_DEVICE)):
                _steps_to_device(opt, group)
            if tensor_lr and "capturable" in group:
                _lr_on_device(opt, group)


def _steps_to_device(opt, group) -> None:
    """``group``'s step counters on the device, in :data:`COUNT_DTYPE` (fused groups'
    kernels compute in float64 from a float32 count already: left as PyTorch makes them).
    Counters the optimizer makes later, on its first step, are made so too."""
    if group.get("fused"):
        return
    _count_dtype_on_init(opt)
    for p in group["params"]:
        state = opt.state.get(p)
        step = state.get("step") if state else None
        if isinstance(step, torch.Tensor) and (step.device != DEVICE or step.dtype != COUNT_DTYPE):
            state["step"] = step.to(device=DEVICE, dtype=COUNT_DTYPE)


# The dtype of step counters on the device (see the module docstring).
COUNT_DTYPE = torch.float64


def _count_dtype_on_init(opt) -> None:
    """Make the step counters ``opt`` creates on its first step :data:`COUNT_DTYPE`: its
    ``_init_group`` (every ``torch.optim`` optimizer has one; it makes each parameter's
    state and lists the counters for the update) is wrapped on this instance, which
    copies and pickles drop (``Optimizer.__getstate__``)."""
    init = getattr(opt, "_init_group", None)
    if init is None or "_init_group" in opt.__dict__:
        return

    def _init_group(group, *args, **kwargs):
        made = {}
        before = {p: (opt.state.get(p) or {}).get("step") for p in group["params"]}
        result = init(group, *args, **kwargs)
        if group.get("fused"):
            return result
        for p in group["params"]:
            state = opt.state.get(p)
            step = state.get("step") if state else None
            if (step is not None and step is not before[p] and step.device == DEVICE
                    and step.dtype != COUNT_DTYPE):
                state["step"] = made[id(step)] = step.to(COUNT_DTYPE)
        for value in (*args, *kwargs.values()):  # the list of counters the update reads
            if isinstance(value, list):
                value[:] = [made.get(id(v), v) for v in value]
        return result

    opt.__dict__["_init_group"] = _init_group


@dataclass
class _LentLr:
    """A param group's device learning rate, lent to the group during compiled calls."""

    group: dict
    scalar: torch.Tensor
    own: object = None  # the group's own lr (a float) while lent; None for a user's scalar
    value: tuple | None = None  # the scalar's graph value when ``own`` was written into it


def _lr_on_device(opt, group) -> None:
    """Lend ``group`` a device scalar holding its ``lr`` (see :func:`give_back`)."""
    # id(group) -> its _LentLr: the entry holds the group, so its id cannot be reused by
    # another group (``load_state_dict`` makes new ones) while the entry lives.
    owned = opt.__dict__.setdefault("_torchspmd_lr", {})
    lr = group["lr"]
    entry = owned.get(id(group))
    if entry is not None and entry.group is not group:
        entry = None
    if entry is not None and lr is entry.scalar:
        return
    if isinstance(lr, torch.Tensor) and lr.device == DEVICE:
        owned[id(group)] = _LentLr(group, lr)  # the user's own device scalar: theirs to fill
        return
    value = float(lr)
    if entry is None or entry.own is None:  # (never write into a user's own scalar)
        for key in [k for k, e in owned.items()
                    if not any(e.group is current for current in opt.param_groups)]:
            del owned[key]  # groups the optimizer dropped
        entry = owned[id(group)] = _LentLr(
            group, torch.tensor(value, dtype=torch.float64, device=DEVICE))
    elif value != float(entry.own) or entry.scalar.handle.storage.value is not entry.value:
        # New host data for the same tensor: an upload, not a program run.
        host = np.array(value, dtype=np.float64)
        entry.scalar.handle.storage.set(new_leaf(entry.scalar.handle.meta, host=host))
    entry.own, entry.value = lr, entry.scalar.handle.storage.value
    group["lr"] = entry.scalar


def give_back(optimizers: list[torch.optim.Optimizer]) -> None:
    """Put each group's own learning rate back where :func:`prepare` lent it a device
    scalar, once a compiled call is over: between calls ``group["lr"]`` is the user's
    float, as on CPU (a list of ``group["lr"]`` read after each call is the schedule's
    history, not N references to one tensor that the next call refills), and schedulers
    compute in Python floats.

    Example: ``prepare([opt]); step(); give_back([opt])``.
    """
    for opt in optimizers:
        for entry in opt.__dict__.get("_torchspmd_lr", {}).values():
            if entry.own is not None and entry.group.get("lr") is entry.scalar:
                entry.group["lr"] = entry.own


def _portable_state_dict(opt, state_dict: dict) -> dict:
    """``opt.state_dict()`` as the optimizer had it before :func:`prepare`: learning rates
    as floats and ``capturable`` as the user set it (a CPU copy can load it)."""
    original = opt.__dict__.get("_torchspmd_capturable", {})
    for i, group in enumerate(state_dict["param_groups"]):
        if isinstance(group.get("lr"), torch.Tensor):
            group["lr"] = group["lr"].item()
        if i in original:
            group["capturable"] = original[i]
    return state_dict


def hyperparameters(optimizers: list[torch.optim.Optimizer]) -> tuple:
    """The Python-number hyperparameters of ``optimizers``' param groups, to compare."""
    found = []
    for i, opt in enumerate(optimizers):
        for j, group in enumerate(opt.param_groups):
            for key, value in group.items():
                # Numbers, and tuples of them (Adam's ``betas``, which OneCycleLR's
                # cycle_momentum changes every step).
                if key != "params" and (type(value) in NUMBERS or type(value) is tuple and all(
                        type(v) in NUMBERS for v in value)):
                    found.append((i, j, key, value))
    return tuple(found)
