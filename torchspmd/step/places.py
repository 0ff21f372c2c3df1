"""Places: the Python slots a compiled step may fill with tensors, found by walking objects.

A step keeps its state in module parameters and buffers, ``p.grad``, ``optimizer.state``
and plain attributes. When the step puts a *new* tensor in such a slot (``backward()``
makes ``p.grad`` after ``zero_grad()``), a replay must put the replayed value in the same
slot. A :class:`Place` names one slot; :func:`find_places` lists every slot reachable
from the step function's arguments, closure and globals.

Example::

    places = find_places(train_step, (x, y), {})
    places.tensors()     # {Place(model.weight, 'grad'): tensor, ...}
"""

from __future__ import annotations

import builtins
import collections.abc
import dis
import functools
import types
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from torchspmd.device.tensor import SpmdTensor
from torchspmd.step.optim import NUMBERS

MAX_DEPTH = 6  # how deep find_places looks from a root
# PyTorch objects other than modules and optimizers are not looked into (their internals
# hold tensors that are no step's state), except these, whose attributes are state: a
# GradScaler's scale and growth tracker are made on its first ``scale()``, often inside a
# step, and updated in place by later steps.
_STATEFUL_TORCH_TYPES = (torch.amp.GradScaler,)
SKIPPED_TYPES = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type,
                  types.MethodType, str, bytes, int, float, bool, type(None), torch.device,
                  torch.dtype)


@dataclass(frozen=True)
class Place:
    """One slot: ``container[key]`` (``item``) or ``container.key`` (attribute)."""

    container: Any = field(compare=False)
    key: Any
    item: bool
    ident: int = 0  # id(container), for hashing and equality

    def get(self):
        """What the slot holds; None where it holds nothing or is gone (a list shortened
        since the walk), as for a missing dict key or attribute."""
        if not self.item:
            return getattr(self.container, self.key, None)
        if isinstance(self.container, dict):
            return self.container.get(self.key)
        try:
            return self.container[self.key]
        except (IndexError, KeyError):  # a shortened sequence, a mapping without the key
            return None

    def getter(self) -> Callable[[], Any]:
        """``get`` as a callable without a Python frame, for loops over many places."""
        if self.item and type(self.container) is dict:
            return functools.partial(dict.get, self.container, self.key)
        if not self.item:
            return functools.partial(getattr, self.container, self.key, None)
        return self.get

    def set(self, value) -> None:
        if self.item:
            self.container[self.key] = value
        elif self.key == "grad":  # Tensor.grad checks device and type: bypass nothing
            self.container.grad = value
        else:
            setattr(self.container, self.key, value)

    def __str__(self) -> str:
        name = type(self.container).__name__
        return f"{name}[{self.key!r}]" if self.item else f"{name}.{self.key}"


def place_of(container, key, item: bool) -> Place:
    return Place(container, key, item, id(container))


class Places:
    """The slots found by one walk, and what they held when walked."""

    def __init__(self):
        self.held: dict[Place, Any] = {}  # place -> tensor or None
        self.optimizers: list[torch.optim.Optimizer] = []
        # Closure cells and globals holding tensors or Python numbers (a step rebinding one
        # would do so at its capture only)
        self.rebindable: dict[Place, Any] = {}
        # Attributes and items of walked objects holding Python numbers (``trainer.calls``):
        # one the step changes would change at its capture only, as a replay runs no Python
        self.numbers: dict[Place, Any] = {}
        # Containers of walked slots and the slot holding each (``opt.state[p]`` in
        # ``opt.state``, a submodule in its parent): a replay finds its slots through
        # these, so one replaced (``load_state_dict``, a new submodule) means capture again.
        self.links: dict[Place, Any] = {}
        # Each walked module and its ``training`` flag (``model.eval()`` changes the step).
        self.modes: list[tuple[torch.nn.Module, bool]] = []
        # Each optimizer group's ``params`` list and its parameters (one appended changes
        # the step).
        self.group_params: list[tuple[list, tuple]] = []
        # CPU tensors in the walked slots (a counter in an optimizer's state, a module's
        # CPU attribute): a step that changes one does something a replay cannot redo.
        self.host: dict[Place, HostTensor] = {}
        # Learning-rate schedulers reached: one the step advances (``sched.step()``
        # inside it) would advance at the capture only.
        self.schedulers: list[torch.optim.lr_scheduler.LRScheduler] = []

    def note_host(self, place: Place, value, name: str, hint: str = "") -> None:
        """Note ``value`` if it is a CPU tensor, with its version now."""
        if _is_host_tensor(value):
            try:
                version = value._version
            except RuntimeError:  # an inference-mode tensor: it cannot change in place
                return
            self.host.setdefault(place, HostTensor(value, version, name, hint))

    def tensors(self) -> dict[Place, torch.Tensor]:
        return {p: t for p, t in self.held.items() if t is not None}


@dataclass(frozen=True)
class HostTensor:
    """A CPU tensor in a walked slot, its version counter when walked, and its name for
    messages (``"SGD.state[<tensor of shape (4,)>]['calls']"``), with what to do
    about its kind of slot (``hint``, read after the general advice)."""

    tensor: torch.Tensor
    version: int
    name: str
    hint: str = ""

    def changed(self, place: Place) -> bool:
        """Whether it was changed in place, or its slot now holds another CPU tensor."""
        now = place.get()
        if now is not self.tensor:
            return _is_host_tensor(now)
        return self.tensor._version != self.version


def _is_host_tensor(value) -> bool:
    """Whether ``value`` is a plain CPU tensor or parameter (not a tensor subclass)."""
    return type(value) in (torch.Tensor, torch.nn.Parameter) and value.device.type == "cpu"


def find_places(fn: Callable, args: tuple, kwargs: dict) -> Places:
    """Every tensor slot reachable from ``fn``'s arguments, closure and referenced globals."""
    places = Places()
    seen: set[int] = set()
    for value in (*args, *kwargs.values()):
        _visit(value, places, seen, 0)
    for root in roots(fn):
        if root.place is not None and (isinstance(root.value, SpmdTensor) or root.value is None
                                       or type(root.value) in NUMBERS):
            places.rebindable[root.place] = root.value
        elif root.place is not None and isinstance(root.value, torch.Tensor):
            places.note_host(root.place, root.value, root.name)
        elif root.place is not None and not isinstance(root.value, SKIPPED_TYPES):
            # A global or closure variable naming a model or an optimizer: rebound to a
            # new one (``opt = AdamW(...)`` between calls), the step must see the new one.
            places.links[root.place] = root.value
        _visit(root.value, places, seen, 0)
    return places


@dataclass(frozen=True)
class Root:
    """An object a step can reach without an argument: ``value``, the slot that holds it
    if the step could rebind it (a closure cell, a global), and its name for messages."""

    value: Any
    place: Place | None
    name: str


def roots(fn) -> list[Root]:
    """The objects ``fn`` can reach: its closure cells, the globals its code names, and
    ``self`` for a bound method."""
    roots: list[Root] = []
    if isinstance(fn, types.MethodType):
        roots.append(Root(fn.__self__, None, "self"))
        fn = fn.__func__
    if isinstance(fn, torch.nn.Module):
        return [Root(fn, None, "the step module")]
    code = getattr(fn, "__code__", None)
    if code is None:
        return roots + [Root(fn, None, "the step object")]
    for cell, name in zip(fn.__closure__ or (), code.co_freevars):
        try:
            roots.append(Root(cell.cell_contents, place_of(cell, "cell_contents", False),
                              f"closure variable {name!r}"))
        except ValueError:  # an empty cell
            continue
    globals_ = fn.__globals__
    for name in _names(code):
        # A name not bound yet reads as None: the step may bind it (``global cache``).
        if name in globals_ or not hasattr(builtins, name):
            roots.append(Root(globals_.get(name), place_of(globals_, name, True),
                              f"global {name!r}"))
    return roots


_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL", "LOAD_NAME",
                         "STORE_NAME"})


@functools.lru_cache(maxsize=256)
def _names(code) -> tuple[str, ...]:
    """Global names ``code`` and the functions defined inside it load or store. Not
    ``co_names``, which lists attribute names too: ``opt.step()`` would make a loop's
    ``for step in ...`` global a number the step reads, checked before each replay."""
    names = [i.argval for i in dis.get_instructions(code) if i.opname in _GLOBAL_OPS]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.extend(_names(const))
    return tuple(dict.fromkeys(names))


def _visit(obj, places: Places, seen: set[int], depth: int) -> None:
    if depth > MAX_DEPTH or isinstance(obj, SKIPPED_TYPES) or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        if isinstance(obj, SpmdTensor):
            # backward fills .grad of leaves (and of retain_grad tensors) only; reading it
            # on another tensor makes PyTorch warn
            grad = obj.grad if obj.is_leaf or obj.retains_grad else None
            places.held.setdefault(place_of(obj, "grad", False), grad)
        return
    if isinstance(obj, torch.nn.Module):
        _visit_module(obj, places, seen, depth)
    elif isinstance(obj, torch.optim.Optimizer):
        # One over CPU parameters (a reference run beside the step, reached through the
        # same list) is not the step's: made replayable it would break on the CPU.
        if any(isinstance(p, SpmdTensor) for g in obj.param_groups for p in g["params"]):
            _visit_optimizer(obj, places, seen, depth)
    elif isinstance(obj, torch.optim.lr_scheduler.LRScheduler):
        places.schedulers.append(obj)
        _visit(obj.optimizer, places, seen, depth + 1)
    elif isinstance(obj, (dict, collections.abc.MutableMapping)):
        _visit_items(obj, obj.items(), places, seen, depth, settable=True)
    elif isinstance(obj, (list, collections.abc.MutableSequence)):  # a deque too
        _visit_items(obj, enumerate(obj), places, seen, depth, settable=True)
    elif isinstance(obj, tuple):
        _visit_items(obj, enumerate(obj), places, seen, depth, settable=False)
    elif has_attributes(obj):
        _visit_attributes(obj, places, seen, depth)


def has_attributes(obj) -> bool:
    """Whether the walk looks at ``obj``'s attributes: objects of the program's own
    classes (``__dict__`` or ``__slots__``), and ``_STATEFUL_TORCH_TYPES``."""
    if isinstance(obj, _STATEFUL_TORCH_TYPES):
        return True
    return (type(obj).__module__.split(".")[0] not in ("builtins", "torch", "jax", "numpy")
            and (hasattr(obj, "__dict__") or hasattr(type(obj), "__slots__")))


def attributes(obj) -> list[tuple[str, Any]]:
    """``obj``'s attributes: its ``__dict__`` and the ``__slots__`` set on it."""
    found = list(vars(obj).items()) if hasattr(obj, "__dict__") else []
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and hasattr(obj, name):
                found.append((name, getattr(obj, name)))
    return found


# A mapping with more numbers than this is data (a table), not settings a replay checks.
_MAX_NUMBERS = 256


def _visit_items(container, items, places, seen, depth, settable: bool) -> None:
    # Numbers are checked before every replay: a dict's (``config["scale"]``), not a
    # sequence's, which is data
    numbers = (settable and isinstance(container, collections.abc.Mapping)
               and len(container) <= _MAX_NUMBERS)
    for key, value in list(items):
        if isinstance(value, SpmdTensor) and settable:
            places.held[place_of(container, key, True)] = value
        elif numbers and type(value) in NUMBERS:
            places.numbers[place_of(container, key, True)] = value
        elif isinstance(value, torch.Tensor):
            place = place_of(container, key, True)
            places.note_host(place, value, str(place))
        _visit(value, places, seen, depth + 1)


def _visit_attributes(obj, places, seen, depth) -> None:
    # torchspmd's own objects (a compiled step's call count, generate's bookkeeping) hold
    # numbers no step computes with
    numbers = not type(obj).__module__.startswith("torchspmd.")
    for key, value in attributes(obj):
        if isinstance(value, SpmdTensor):
            places.held[place_of(obj, key, False)] = value
        elif numbers and type(value) in NUMBERS:
            places.numbers[place_of(obj, key, False)] = value
        elif isinstance(value, torch.Tensor):
            places.note_host(place_of(obj, key, False), value, f"{type(obj).__name__}.{key}")
        _visit(value, places, seen, depth + 1)


def _visit_module(module: torch.nn.Module, places, seen, depth) -> None:
    for sub in module.modules():
        seen.add(id(sub))
        places.modes.append((sub, sub.training))
        for key, child in sub._modules.items():
            if child is not None:
                places.links[place_of(sub._modules, key, True)] = child
        for table in (sub._parameters, sub._buffers):
            for key, value in table.items():
                if isinstance(value, SpmdTensor):
                    places.held[place_of(table, key, True)] = value
                    _visit(value, places, seen, depth + 1)
                elif value is not None:
                    places.note_host(place_of(table, key, True), value,
                                     f"{type(sub).__name__}.{key}")
        for key, value in vars(sub).items():
            if isinstance(value, SpmdTensor):
                places.held[place_of(sub, key, False)] = value
            elif isinstance(value, torch.Tensor):
                places.note_host(place_of(sub, key, False), value, f"{type(sub).__name__}.{key}")
            elif type(value) in NUMBERS and not key.startswith("_") and key != "training":
                places.numbers[place_of(sub, key, False)] = value  # ``training``: modes
            elif not key.startswith("_") and not isinstance(value, torch.nn.Module):
                _visit(value, places, seen, depth + 1)


def _visit_optimizer(opt: torch.optim.Optimizer, places, seen, depth) -> None:
    places.optimizers.append(opt)
    places.links[place_of(opt, "state", False)] = opt.state
    places.links[place_of(opt, "param_groups", False)] = opt.param_groups
    for i, group in enumerate(opt.param_groups):
        places.links[place_of(opt.param_groups, i, True)] = group
        # The list itself too: ``group["params"] = [...]`` replaces it
        places.links[place_of(group, "params", True)] = group["params"]
        places.group_params.append((group["params"], tuple(group["params"])))
    for p, state in opt.state.items():
        places.links[place_of(opt.state, p, True)] = state
    for group in opt.param_groups:
        for key, value in group.items():
            if isinstance(value, SpmdTensor):
                places.held[place_of(group, key, True)] = value
        for p in group["params"]:
            _visit(p, places, seen, depth + 1)
    for p, state in opt.state.items():
        if isinstance(state, dict):
            for key, value in state.items():
                if isinstance(value, SpmdTensor):
                    places.held[place_of(state, key, True)] = value
                elif isinstance(value, torch.Tensor):
                    name = type(opt).__name__
                    places.note_host(place_of(state, key, True), value,
                                     f"{name}.state[{key_name(p)}][{key!r}]",
                                     f" ({name} keeps it on the CPU; SGD, Adam, AdamW, Adagrad, "
                                     "RMSprop and the optimizers with a capturable option "
                                     "keep their state on the device in a compiled step)")


def key_name(key) -> str:
    """A dict key for a path (a tensor key, as in ``optimizer.state``, by its shape: its
    repr would read its values)."""
    if isinstance(key, torch.Tensor):
        return f"<tensor of shape {tuple(key.shape)}>"
    return repr(key)
