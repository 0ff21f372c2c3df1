"""The self-test that calibrates ``ownership`` at import: every ownership question, asked of
objects whose holders are known, through the very functions the runtime calls.

Each scenario builds what a question sees in the runtime (real lazy nodes, storages and
handles; a real ``.grad`` slot of a CPU tensor for the C++ side; a stand-in for the
``jax.Array``, since JAX may not be started yet) with either no other holder or one
hidden holder at one step of the path, and says what the answer must be. An interpreter
that counts references differently (or a torch whose ``use_count`` does) gets some
answer wrong, and donation is turned off.

Example::

    base()          # what getrefcount adds for a local name passed to it (1 on 3.11)
    wrong_answer()  # None, or which scenario got a wrong answer
"""

from __future__ import annotations

import functools
import sys
import warnings
import weakref

import torch

from torchspmd.lazy.handle import Handle, Storage
from torchspmd.lazy.node import Node, TensorMeta
from torchspmd.runtime import ownership
from torchspmd.runtime.graph import Graph

_META = TensorMeta((2,), (1,), torch.float32)
# Runs enough for the interpreter's adaptive (specializing) bytecode to settle.
_ROUNDS = 3


class _Sharding:
    device_set = frozenset()  # no devices: two stand-ins are on the same (empty) set


class _Buffer:
    """Stands in for a ``jax.Array``: weakly referable, with a sharding."""

    __slots__ = ("sharding", "__weakref__")

    def __init__(self):
        self.sharding = _Sharding()


def base() -> int:
    """What ``getrefcount`` reports beyond the holders of an object passed as a local."""
    probe = _Buffer()  # held by this local only
    return ownership._getrefcount(probe) - 1


def _state(hidden_at: str) -> bool:
    """A compiled step's state value, with a hidden holder at ``hidden_at``."""
    array = _Buffer()
    node = Node.from_arrays([array])
    storage = Storage((node, 0), _META)
    values, arrays, flying, hidden = [storage.value], [array], set(), []
    if hidden_at == "value":
        hidden.append(storage.value)
    elif hidden_at == "node":
        hidden.append(node)
    elif hidden_at in ("array", "in flight"):
        hidden.append(array)  # the in-flight list, when ``flying`` names it
    elif hidden_at == "alias":
        hidden.append(_Buffer())
        ownership.note_shared(array, hidden[-1], check=False)
    if hidden_at in ("in flight", "in flight, not held"):
        flying.add(id(array))
    del array, node
    expected = hidden_at in ("nothing", "in flight")
    return ownership.exclusive(values, arrays, [0], flying) == [expected]


def _sync(hidden_at: str) -> bool:
    """A sync's graph leaf -> middle -> root, with a hidden holder at ``hidden_at``."""
    array = _Buffer()
    leaf = Node.from_arrays([array])
    value = (leaf, 0)
    middle = Node(None, (value,))
    root = Node(None, ((middle, 0),))
    graph = Graph(nodes=[middle, root], leaves=[value], roots=[root], wanted=[(0,)],
                  key=(), operands=[[~0], [0]])
    inputs, flying, hidden = [array], set(), []
    if hidden_at == "value":
        hidden.append(value)  # a tensor (or a copy_ target) still showing the old value
    elif hidden_at == "leaf":
        hidden.append(leaf)
    elif hidden_at in ("array", "in flight"):
        hidden.append(array)
    elif hidden_at == "middle":
        hidden.append(middle)
    elif hidden_at == "middle's value":
        hidden.append(root.inputs[0])  # a stale view's pending value
    elif hidden_at == "alias":
        hidden.append(_Buffer())
        ownership.note_shared(array, hidden[-1], check=False)
    elif hidden_at in ("relabeled", "relabeled, held"):
        inputs = [_Buffer()]  # placed anew over the same devices
        ownership.note_shared(array, inputs[0], check=False)
        if hidden_at == "relabeled, held":
            hidden.append(inputs[0])
    if hidden_at in ("in flight", "in flight, not held"):
        flying.add(id(array))
    del array, leaf, value, middle, root
    expected = [0] if hidden_at in ("nothing", "in flight", "relabeled") else []
    return ownership.unheld_leaves(graph, inputs, flying) == expected


def _handle_of(tensor):
    # The stand-in gradient carries its handle where an spmd tensor shows it (``.handle``).
    return getattr(tensor, "handle", None)


def _gradient(hidden_at: str) -> bool:
    """A ``.grad`` slot's old gradient (a CPU tensor carrying a lazy handle), with a hidden
    holder at ``hidden_at``."""
    param = torch.zeros(2, requires_grad=True)
    grad = torch.zeros(2)
    array = _Buffer()
    array_id = id(array)
    grad.handle = Handle.new((Node.from_arrays([array]), 0), _META)
    param.grad = grad
    hidden = []
    if hidden_at == "tensor":
        hidden.append(grad)
    elif hidden_at == "weak reference":
        hidden.append(weakref.ref(grad))
    elif hidden_at == "another slot":  # a C++ holder
        hidden.append(torch.zeros(2, requires_grad=True))
        hidden[-1].grad = grad
    elif hidden_at == "autograd":  # saved for backward: another C++ holder
        hidden.append(grad * torch.ones(2, requires_grad=True))
    elif hidden_at == "requires grad":
        grad.requires_grad_()
    elif hidden_at in ("handle", "storage", "value", "node", "array"):
        handle = grad.handle
        hidden.append({"handle": handle, "storage": handle.storage,
                       "value": handle.storage.value, "node": handle.storage.value[0],
                       "array": array}[hidden_at])
        del handle
    elif hidden_at == "alias":
        hidden.append(_Buffer())
        ownership.note_shared(array, hidden[-1], check=False)
    del grad, array
    slot = ownership.GradientSlot(
        get=functools.partial(getattr, param, "grad", None),
        clear=functools.partial(setattr, param, "grad", None),
        handle_of=_handle_of, usable=lambda a: True, keeps=torch.Tensor)
    given, kept = ownership.sole_gradient(slot)
    if hidden_at == "nothing":  # given, and the tensor stays in its slot
        return id(given) == array_id and kept is not None and kept is param.grad
    if hidden_at in ("weak reference", "requires grad"):  # given; the tensor is dropped
        return id(given) == array_id and kept is None and param.grad is None
    return given is None and kept is None and param.grad is None


def _holder(where: str) -> str:
    return "no other holder" if where == "nothing" else f"a hidden holder at its {where}"


_SCENARIOS = [
    *[(_state, f"a compiled step's state value with {_holder(where)}", where)
      for where in ("nothing", "value", "node", "array", "alias", "in flight",
                    "in flight, not held")],
    *[(_sync, f"a sync's leaf with {_holder(where)}", where)
      for where in ("nothing", "value", "leaf", "array", "middle", "middle's value", "alias",
                    "in flight", "in flight, not held", "relabeled", "relabeled, held")],
    *[(_gradient, f"an old gradient with {_holder(where)}", where)
      for where in ("nothing", "tensor", "weak reference", "another slot", "autograd",
                    "requires grad", "handle", "storage", "value", "node", "array",
                    "alias")],
]


def wrong_answer() -> str | None:
    """The first scenario whose answer is wrong (a sentence), or None when all are right."""
    for _ in range(_ROUNDS):
        for scenario, said, where in _SCENARIOS:
            if not scenario(where):
                return said
    return None


def calibrate() -> ownership.Counting:
    """Ask each question of objects whose holders are known; set ``ownership.COUNTING``.

    Runs once when this module is imported (``donation.py`` imports it). Example:
    ``calibrate().ok`` is True on CPython 3.11 with torch 2.13.
    """
    counting = ownership.COUNTING
    counting.ok, counting.reason = False, "calibrating"
    if ownership._getrefcount is None:
        counting.reason = "this interpreter has no sys.getrefcount"
        return counting
    counting.base = base()
    counting.ok = True  # the questions answer only while ok
    wrong = wrong_answer()
    if wrong is not None:
        counting.ok = False
        counting.reason = (f"reference counts on {sys.implementation.name} "
                           f"{sys.version.split()[0]} do not show {wrong}: donation is off")
    else:
        counting.reason = ""
    return counting


if not calibrate().ok:  # said once, where the process starts: memory use will be higher
    warnings.warn(f"torchspmd: {ownership.COUNTING.reason}", RuntimeWarning, stacklevel=2)
