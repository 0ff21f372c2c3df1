"""What a capture refuses: Python side effects of a step that its replays cannot redo.

A replay runs only the device program. A step that rebinds a global or closure variable
holding a tensor or a number, advances a learning-rate scheduler or sets an optimizer
hyperparameter in Python, or changes a CPU tensor that outlives it, would do so at its
capture only; the capture compares them before and after the step and raises, naming
what changed and what to do instead.

Example::

    state = PythonState.of(before)   # before the step runs
    ...                              # the step runs, recorded
    state.check()                    # HostStateError: "the step advanced ... StepLR"
    check_rebinding(before)          # RebindingError: "the step rebound 'calls'"
    check_host_state(before)
"""

from __future__ import annotations

from dataclasses import dataclass

from torchspmd.device.tensor import SpmdTensor
from torchspmd.step import optim
from torchspmd.step.places import Places


class RebindingError(RuntimeError):
    """A compiled step rebound a tensor that lives in a slot replays cannot write, or a
    global or closure variable holding a tensor or a number."""


class HostStateError(RuntimeError):
    """A compiled step changed host state that outlives it (a CPU tensor, a scheduler's
    epoch, an optimizer's Python hyperparameter): a replay runs only the device program,
    so the change would happen once."""


def check_rebinding(before: Places) -> None:
    """A global or closure variable that held a tensor (or a Python number) must hold it
    still."""
    for place, old in before.rebindable.items():
        now = place.get()
        if now is old:
            continue
        if old is None:
            if isinstance(now, SpmdTensor):
                continue  # bound on first use: this call is a warm-up (``first_binding``)
            raise RebindingError(
                f"torchspmd.compile: the step bound {_named(place)} (None before) to "
                f"{type(now).__name__} {now!r}. A replay runs no Python, so it would keep "
                "this value and later calls would compute as this one did. Set it before "
                "the first call, or pass it as an argument.")
        if not isinstance(old, SpmdTensor):
            if same_number(now, old):
                continue
            raise RebindingError(
                f"torchspmd.compile: the step rebound {_named(place)}, a Python number "
                f"({old!r} -> {now!r}). A replay runs no Python, so the number would keep "
                "this value and later calls would compute as this one did. Pass the number "
                "as an argument (each new value captures the step again), keep it in a 0-d "
                "tensor on the device updated in place (t.add_(1)), or change it outside "
                "the step.")
        raise RebindingError(
            f"torchspmd.compile: the step rebound {_named(place)}, which held a tensor before the "
            "step. A replay runs no Python, so the new tensor would be lost (the name "
            "would silently keep its old value). Update it in place (t.copy_(new), "
            "t.add_(x)), keep it as a module attribute or buffer, or return it from the "
            "step and assign it outside.")


def same_number(now, old) -> bool:
    """Whether Python number ``now`` is ``old``'s value: the same type (``1`` and ``1.0``
    record different graphs) and equal, a NaN equal to a NaN."""
    return type(now) is type(old) and (now == old or (now != now and old != old))


def check_numbers(before: Places) -> None:
    """An attribute or item of a walked object that held a Python number must hold it
    still (``self.calls += 1`` in the step would count the capture only)."""
    for place, old in before.numbers.items():
        now = place.get()
        if now is old or same_number(now, old):
            continue
        raise RebindingError(
            f"torchspmd.compile: the step changed {place}, a Python number ({old!r} -> "
            f"{now!r}). A replay runs no Python, so it would keep this value and later "
            "calls would compute as this one did. Keep it in a 0-d tensor on the device "
            "updated in place (t.add_(1)), pass it as an argument (each new value captures "
            "the step again), or change it outside the step.")


def _named(place) -> str:
    """A global's name in quotes, or "a closure variable"."""
    return repr(place.key) if place.item else "a closure variable"


def first_binding(before: Places) -> str:
    """Why this call is a warm-up: a global or closure variable that held None (or was not
    bound) holds a tensor after the step (``cache = torch.zeros(...)`` on first use); ""
    if none does. The next call captures with the tensor in place, as for optimizer state
    made on first use."""
    for place, old in before.rebindable.items():
        if old is None and isinstance(place.get(), SpmdTensor):
            return f"{_named(place)} bound on first use"
    return ""


@dataclass(frozen=True)
class PythonState:
    """The optimizers' Python-number hyperparameters and each scheduler's epoch before a
    step: one the step changes (``sched.step()`` or ``group["lr"] = ...`` inside it)
    would change at the capture only, as a replay runs no Python."""

    optimizers: list
    hyper: tuple
    schedules: tuple  # (scheduler, its state_dict()): its epoch, and what ``restore`` loads

    @staticmethod
    def of(places: Places) -> "PythonState":
        return PythonState(places.optimizers, optim.hyperparameters(places.optimizers),
                           tuple((s, s.state_dict()) for s in places.schedulers))

    def restore(self) -> None:
        """Put the hyperparameters and schedulers back as they were (a refused step)."""
        for scheduler, state in self.schedules:
            scheduler.load_state_dict(state)
        for i, group, key, value in self.hyper:
            self.optimizers[i].param_groups[group][key] = value

    def check(self) -> None:
        """Raise :class:`HostStateError` naming what the step changed, if it did."""
        for scheduler, state in self.schedules:
            if scheduler.last_epoch != state["last_epoch"]:
                name = type(scheduler).__name__
                raise HostStateError(
                    f"torchspmd.compile: the step advanced the learning-rate scheduler {name} "
                    "(its step() ran inside the step). A replay runs only the device program, "
                    "so the schedule would stop at this call's learning rate. Call the "
                    "scheduler's step() outside the compiled step, after each call.")
        before = {(i, group, key): old for i, group, key, old in self.hyper}
        for i, group, key, new in optim.hyperparameters(self.optimizers):
            old = before.get((i, group, key), new)
            if old != new:
                raise HostStateError(
                    f"torchspmd.compile: the step changed its optimizer's {key!r} in param "
                    f"group {group} ({old!r} -> {new!r}) in Python. A replay runs only the "
                    "device program, so the change would happen at this call only. Change "
                    "hyperparameters outside the compiled step (between calls; a new value "
                    "then captures the step again, or for Adam's lr travels as data).")


def check_host_state(before: Places) -> None:
    """No CPU tensor in a walked slot was changed by the step (in place, or its slot
    rebound to another CPU tensor): a replay would not change it again."""
    for place, host in before.host.items():
        if host.changed(place):
            raise HostStateError(
                f"torchspmd.compile: the step changed {host.name}, a CPU tensor that outlives "
                "it. A replay runs only the device program, so the change would happen on "
                "the first call only. Keep the tensor on the device (t.to('spmd')) so the "
                "program updates it, change it outside the step, or run the step without "
                f"torchspmd.compile{host.hint}.")
