"""A Hugging Face model's own tensor-parallel plan (``base_model_tp_plan``) as PyTorch styles.

Hugging Face configs name, per module path of the base model, a style string
(``"colwise"``, ``"rowwise"``, ...). :func:`hf_tp_plan` turns it into the dict of
``ParallelStyle`` that :func:`torchspmd.parallel.plans.parallelize_module` applies, with
paths relative to the whole model; :func:`parallelize_hf` is the one-liner.

Example::

    mesh = torchspmd.Mesh(range(8), (8,), ("model",))
    parallelize_hf(model.to(torchspmd.device()), mesh)        # axis "model"
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
from torch.distributed.tensor.parallel.style import ParallelStyle

from torchspmd.parallel.plans import parallelize_module

# The HF styles whose meaning on global tensors is one of PyTorch's styles.
_STYLES = {
    "colwise": ColwiseParallel,
    "rowwise": RowwiseParallel,
    "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
}


def hf_tp_plan(model: nn.Module) -> dict[str, ParallelStyle]:
    """``model.config.base_model_tp_plan`` as ``{module path: ParallelStyle}``, paths from ``model``.

    Example::

        >>> hf_tp_plan(llama)["model.layers.*.self_attn.q_proj"]
        ColwiseParallel(...)
    """
    config = getattr(model, "config", None)
    plan = getattr(config, "base_model_tp_plan", None)
    if not plan:
        raise ValueError(
            f"torchspmd.generation: {type(model).__name__}'s config has no base_model_tp_plan; "
            "write the plan yourself ({module path: ColwiseParallel() or RowwiseParallel()}) and "
            "pass it to torchspmd.parallel.plans.parallelize_module, or mark_sharding the weights")
    prefix = getattr(model, "base_model_prefix", "")
    if prefix and isinstance(getattr(model, prefix, None), nn.Module):
        prefix += "."
    else:
        prefix = ""
    styles = {}
    for path, style in plan.items():
        make = _STYLES.get(style)
        if make is None:
            raise ValueError(
                f"torchspmd.generation: the tensor-parallel style {style!r} of {path!r} in "
                f"{type(model).__name__}'s base_model_tp_plan is not supported (supported: "
                f"{', '.join(sorted(_STYLES))}); pass your own plan to parallelize_module")
        styles[prefix + path] = make()
    return styles


def parallelize_hf(model: nn.Module, mesh: Any, axis: str = "model") -> nn.Module:
    """Shard ``model`` (on the spmd device) over mesh axis ``axis`` by its own HF TP plan.

    Example::

        >>> parallelize_hf(model, torchspmd.Mesh(range(8), (8,), ("model",)))
    """
    return parallelize_module(model, mesh, hf_tp_plan(model), tp_axis=axis)
