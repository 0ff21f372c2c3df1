"""The decisions a planner makes: parameter roles, found from the module structure.

A *role* is a module's name with the index of a repeated layer stripped
(``blocks.3.up`` -> ``blocks.*.up``) when the layers of that ``ModuleList`` /
``Sequential`` are all alike (same types and parameter shapes); the parameters of one
role share one decision, so a 24-layer model has as many decisions as a 1-layer one.

A *group* is one decision: a linear layer, an embedding, or a tensor-parallel unit, a
run of linears in one module where the first ones read the same features (columns:
``qkv``; ``q``/``k``/``v``; ``gate``/``up``) and the last one writes them back (row:
``proj``, ``o_proj``, ``down``), Megatron-LM's column/row pair. Everything else (norms,
biases of row layers, free parameters) stays replicated.

Example::

    >>> from torchspmd.testing.models import TinyTransformer
    >>> model = TinyTransformer(layers=2)
    >>> [g.role for g in find_groups(model, (torch.zeros(2, 16, dtype=torch.long),))]
    ['blocks.*.qkv+proj', 'blocks.*.up+down', 'head', 'pos', 'tok']
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable

import torch
from torch import nn

__all__ = ["Layer", "Group", "find_groups", "repeated_modules"]


@dataclasses.dataclass(frozen=True)
class Layer:
    """One linear-like or embedding module of the model, as the step sees it.

    ``out_dim``/``in_dim``: which weight dims hold output and input features (``Linear``
    0/1; Hugging Face's ``Conv1D`` 1/0); ``activation``: the shape of its input;
    ``batched``: whether that input's dim 0 is the batch.
    """

    name: str
    kind: str  # "linear" or "embedding"
    weight: str
    bias: str | None
    shape: tuple[int, ...]
    out_dim: int
    in_dim: int
    activation: tuple[int, ...]
    batched: bool
    dtype: str


@dataclasses.dataclass(frozen=True)
class Group:
    """One decision variable: ``kind`` ``"linear"``, ``"embedding"`` or ``"unit"`` (columns
    then one row linear); ``occurrences``: each repetition's layers, in order."""

    role: str
    kind: str
    occurrences: tuple[tuple[Layer, ...], ...]

    @property
    def count(self) -> int:
        return len(self.occurrences)


def repeated_modules(model: nn.Module) -> list[str]:
    """Names of the containers whose children are alike (repeated layers), in order.

    Example::

        >>> from torchspmd.testing.models import TinyTransformer
        >>> repeated_modules(TinyTransformer(layers=2))
        ['blocks']
    """
    found = []
    for name, module in model.named_modules():
        if isinstance(module, (nn.ModuleList, nn.Sequential)) and len(module) > 1:
            shapes = {_structure(child) for child in module}
            if len(shapes) == 1:
                found.append(name)
    return found


def _structure(module: nn.Module) -> tuple:
    return (type(module).__name__,
            tuple((n, tuple(p.shape)) for n, p in module.named_parameters()))


def _role(name: str, repeated: list[str]) -> str:
    for container in sorted(repeated, key=len, reverse=True):
        prefix = container + "." if container else ""
        match = re.match(re.escape(prefix) + r"(\d+)(\.|$)", name)
        if match:
            return prefix + "*" + name[match.end() - len(match.group(2)):]
    return name


def _linear_dims(module: nn.Module) -> tuple[int, int] | None:
    if isinstance(module, nn.Linear):
        return 0, 1
    if type(module).__name__ == "Conv1D" and getattr(module, "weight", None) is not None \
            and module.weight.dim() == 2:
        return 1, 0  # Hugging Face GPT-2: weight is (in, out)
    return None


def _activations(model: nn.Module, run: Callable[[], Any]) -> dict[str, tuple]:
    """The input shape of every linear-like and embedding module, from one forward."""
    shapes: dict[str, tuple] = {}
    hooks = []
    for name, module in model.named_modules():
        if _linear_dims(module) is not None or isinstance(module, nn.Embedding):
            def hook(mod, args, name=name):
                if args and isinstance(args[0], torch.Tensor):
                    shapes.setdefault(name, tuple(args[0].shape))
            hooks.append(module.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            run()
    finally:
        for h in hooks:
            h.remove()
    return shapes


def _layers(model: nn.Module, shapes: dict[str, tuple], batch: int) -> dict[str, Layer]:
    params = {id(p) for p in model.parameters()}
    seen: set[int] = set()
    layers = {}
    for name, module in model.named_modules():
        dims = _linear_dims(module)
        embedding = isinstance(module, nn.Embedding)
        if (dims is None and not embedding) or name not in shapes:
            continue
        weight = module.weight
        if id(weight) in seen or id(weight) not in params:
            continue  # a tied weight is decided where it first appears
        seen.add(id(weight))
        bias = getattr(module, "bias", None)
        out_dim, in_dim = dims if dims is not None else (1, 0)
        activation = shapes[name]
        layers[name] = Layer(
            name, "embedding" if embedding else "linear", f"{name}.weight" if name else "weight",
            f"{name}.bias" if isinstance(bias, torch.Tensor) else None, tuple(weight.shape),
            out_dim, in_dim, activation, bool(activation) and activation[0] == batch,
            str(weight.dtype).removeprefix("torch."))
    return layers


def _units(model: nn.Module, layers: dict[str, Layer]) -> list[tuple[Layer, ...]]:
    """Runs of linears in one module, as Megatron units (columns..., row) or singles."""
    out = []
    for name, module in model.named_modules():
        run: list[Layer] = []
        for child, sub in module.named_children():
            full = f"{name}.{child}" if name else child
            layer = layers.get(full)
            if layer is not None and layer.kind == "linear":
                run.append(layer)
                continue
            if next(sub.parameters(), None) is None:
                continue  # an activation or dropout between the linears: the run goes on
            out += _split(run)
            run = []
        out += _split(run)
    return out


def _split(run: list[Layer]) -> list[tuple[Layer, ...]]:
    if len(run) < 2:
        return [tuple(run)] if run else []
    features = run[0].shape[run[0].in_dim]
    columns, row = run[:-1], run[-1]
    if all(c.shape[c.in_dim] == features for c in columns) and row.shape[row.out_dim] == features:
        return [tuple(run)]
    # Otherwise pair neighbours whose features chain (an MLP stack: a -> b -> c).
    first, second = run[0], run[1]
    if first.shape[first.out_dim] == second.shape[second.in_dim]:
        return [(first, second)] + _split(run[2:])
    return [(first,)] + _split(run[1:])


def find_groups(model: nn.Module, example_inputs: tuple,
                run: Callable[[], Any] | None = None) -> list[Group]:
    """The decisions for ``model``, sorted by role (deterministic).

    ``run`` does one forward (default ``model(*example_inputs)``); it is run under
    ``torch.no_grad()`` to read each layer's input shape.
    """
    repeated = repeated_modules(model)
    shapes = _activations(model, run or (lambda: model(*example_inputs)))
    batch = next((t.shape[0] for t in example_inputs
                  if isinstance(t, torch.Tensor) and t.dim() > 0), 1)
    layers = _layers(model, shapes, batch)
    by_role: dict[tuple, list[tuple[Layer, ...]]] = {}
    units = _units(model, layers)
    in_units = {layer.name for unit in units for layer in unit}
    units += [(layer,) for layer in layers.values() if layer.name not in in_units]
    for unit in units:
        key = tuple((_role(layer.name, repeated), layer.shape, layer.activation) for layer in unit)
        by_role.setdefault(key, []).append(unit)
    groups = []
    for key, occurrences in by_role.items():
        role = "+".join(key[0][0] if i == 0 else k[0].rsplit(".", 1)[-1]
                        for i, k in enumerate(key))
        kind = "unit" if len(key) > 1 else occurrences[0][0].kind
        groups.append(Group(role, kind, tuple(occurrences)))
    return sorted(groups, key=lambda g: g.role)
