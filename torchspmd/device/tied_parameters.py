"""``Module.to("spmd")`` keeps tied parameters tied, as ``Module.to("cuda")`` does.

``Module._apply`` converts each submodule's parameters one submodule at a time. For CUDA
it changes each parameter in place (``param.data = ...``), so a ``Parameter`` shared by
two submodules (GPT-2's ``lm_head.weight`` and ``transformer.wte.weight``) stays one
object. A tensor of another type (the spmd wrapper, like PyTorch/XLA's tensors) cannot be
assigned in place, so ``_apply`` makes a new ``Parameter`` per submodule: the tie breaks
silently and the two copies train apart. :func:`install` wraps ``Module._apply`` so the
outermost call remembers which slots shared a parameter (or buffer) and shares the
converted one again afterwards. Example::

    model = GPT2LMHeadModel(config).to(torchspmd.device())
    assert model.lm_head.weight is model.transformer.wte.weight
"""

from __future__ import annotations

import functools
import threading

from torch import nn

__all__ = ["install"]

_STATE = threading.local()  # depth of nested _apply calls on this thread


def _shared_slots(module: nn.Module) -> list[list[tuple[nn.Module, str, str]]]:
    """Groups of (owner, "_parameters" or "_buffers", name) that hold one tensor object."""
    uses: dict[int, list[tuple[nn.Module, str, str]]] = {}
    for owner in module.modules():
        for kind in ("_parameters", "_buffers"):
            for name, tensor in getattr(owner, kind).items():
                if tensor is not None:
                    uses.setdefault(id(tensor), []).append((owner, kind, name))
    return [places for places in uses.values() if len(places) > 1]


def _retie(groups: list[list[tuple[nn.Module, str, str]]]) -> None:
    for (first_owner, first_kind, first_name), *others in groups:
        tensor = getattr(first_owner, first_kind)[first_name]
        for owner, kind, name in others:
            getattr(owner, kind)[name] = tensor


def _wrap(apply):
    @functools.wraps(apply)
    def _apply(self: nn.Module, fn, recurse: bool = True):
        depth = getattr(_STATE, "depth", 0)
        if depth:  # a submodule of a call that re-ties at its end
            return apply(self, fn, recurse)
        groups = _shared_slots(self) if recurse else []
        _STATE.depth = 1
        try:
            result = apply(self, fn, recurse)
        finally:
            _STATE.depth = 0
        _retie(groups)
        return result

    _apply._torchspmd_keeps_ties = True
    return _apply


def install() -> None:
    """Wrap ``nn.Module._apply`` once (idempotent); the behaviour on CPU/CUDA is unchanged
    because there the shared object is updated in place and re-tying is a no-op."""
    if not getattr(nn.Module._apply, "_torchspmd_keeps_ties", False):
        nn.Module._apply = _wrap(nn.Module._apply)
