"""``shard_experts``: expert parallelism for mixture-of-experts blocks, as sharding annotations.

An experts module holds every expert's weights stacked in 3-d parameters (Hugging Face's
layout since transformers 5: ``gate_up_proj`` or ``up_proj``, and ``down_proj``, of shape
``(experts, out, in)``, or ``(experts, in, out)`` where the module says ``is_transposed``;
optional ``*_bias`` of shape ``(experts, out)``). The plan:

- expert weights: the expert dim over ``expert_axis``; inside each expert, Megatron-style
  tensor parallelism over ``tp_axis`` (the intermediate dim: the up projection's output,
  the down projection's input), so each expert needs one reduction;
- a shared expert beside the routed ones (Qwen2-MoE's ``shared_expert``, DeepSeek-V3's
  ``shared_experts``, any child with ``gate_proj``/``up_proj``/``down_proj`` Linears): the
  same tensor parallelism over ``tp_axis``;
- everything else in the MoE block (the router, a shared-expert gate): replicated.

Token dispatch and combine need no annotation: the grouped matmul lowers to
``lax.ragged_dot``, whose group dim XLA's partitioner splits like the weights, so each
device multiplies only its experts' rows and one all-reduce over ``expert_axis`` combines
them. Sharding never changes values.

Example::

    mesh = Mesh(np.arange(8), (4, 2), ("data", "model"))
    plan = shard_experts(model.to("spmd"), mesh, expert_axis="data", tp_axis="model")
    print(plan)  # each parameter, its role, shape and partition spec
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from torch import nn

from torchspmd.sharding.api import mark_sharding
from torchspmd.sharding.mesh import Mesh

__all__ = ["ExpertPlan", "ExpertRole", "ShardedParameter", "shard_experts"]

_SHARED_EXPERT_LINEARS = ("gate_proj", "up_proj", "down_proj")


class ExpertRole(enum.Enum):
    """What a parameter does in a mixture-of-experts block."""

    EXPERTS = "routed experts"
    SHARED_EXPERT = "shared expert"
    ROUTER = "router (replicated)"


@dataclass(frozen=True)
class ShardedParameter:
    """One parameter the plan annotated: its name in the model, role, shape and spec."""

    name: str
    role: ExpertRole
    shape: tuple[int, ...]
    spec: tuple[str | None, ...]


@dataclass
class ExpertPlan:
    """What :func:`shard_experts` did; ``str(plan)`` is a table of it."""

    expert_axis: str
    tp_axis: str | None
    blocks: list[str] = field(default_factory=list)
    parameters: list[ShardedParameter] = field(default_factory=list)

    def __str__(self) -> str:
        width = max((len(p.name) for p in self.parameters), default=9)
        lines = [f"shard_experts: {len(self.blocks)} MoE blocks, experts over "
                 f"{self.expert_axis!r}, tensor parallel over {self.tp_axis!r}",
                 f"{'parameter':<{width}}  {'role':<19}  {'shape':<16}  spec"]
        for p in self.parameters:
            lines.append(f"{p.name:<{width}}  {p.role.value:<19}  {str(p.shape):<16}  {p.spec}")
        return "\n".join(lines)


def shard_experts(model: nn.Module, mesh: Mesh, expert_axis: str = "data",
                  tp_axis: str | None = "model") -> ExpertPlan:
    """Shard every mixture-of-experts block of ``model`` (on the spmd device); returns the plan.

    Args:
      model: a model whose MoE blocks keep their experts in stacked 3-d parameters (every
        Hugging Face MoE model of transformers 5: Mixtral, Qwen2-MoE, DeepSeek-V3, GPT-OSS...).
      mesh: the device mesh.
      expert_axis: the mesh axis the experts are split over.
      tp_axis: the mesh axis each expert's intermediate dim is split over (None: none).

    Example::

        >>> plan = shard_experts(mixtral.to("spmd"), Mesh(range(8), (4, 2), ("data", "model")))
        >>> plan.parameters[0]
        ShardedParameter(name='model.layers.0.mlp.experts.gate_up_proj',
                         role=<ExpertRole.EXPERTS: 'routed experts'>, shape=(4, 128, 32),
                         spec=('data', 'model', None))
    """
    names = mesh.jax_axis_names() if isinstance(mesh, Mesh) else None
    if names is None:
        raise TypeError(f"torchspmd: shard_experts needs a torchspmd Mesh, got {type(mesh).__name__}.")
    for axis in (expert_axis, tp_axis):
        if axis is not None and axis not in names:
            raise ValueError(f"torchspmd: shard_experts: {axis!r} is not an axis of the mesh {names}.")
    if expert_axis == tp_axis:
        raise ValueError("torchspmd: shard_experts: expert_axis and tp_axis must differ "
                         f"(both are {expert_axis!r}); pass tp_axis=None for no tensor parallelism.")
    plan = ExpertPlan(expert_axis, tp_axis)
    experts = [(name, m) for name, m in model.named_modules() if _is_experts(m)]
    if not experts:
        raise ValueError(f"torchspmd: shard_experts found no experts module in {type(model).__name__} "
                         "(one with 3-d 'down_proj' and 'gate_up_proj' or 'up_proj' parameters).")
    devices = mesh.shape()[expert_axis]
    for name, module in experts:  # check all before marking any
        if module.down_proj.shape[0] % devices:
            # An uneven split reaches XLA as a replicated array (see lowering/xla_shardings):
            # every device would hold every expert, silently.
            raise ValueError(f"torchspmd: shard_experts: {name} has {module.down_proj.shape[0]} "
                             f"experts, which do not split evenly over {expert_axis!r} ({devices} "
                             "devices); pick an expert_axis whose size divides the number of experts.")
    modules = dict(model.named_modules())
    for name, module in experts:
        block_name = name.rpartition(".")[0]
        plan.blocks.append(block_name or name)
        _shard_routed(module, name, mesh, plan)
        block = modules[block_name] if block_name else None
        if block is None:
            continue
        for child_name, child in block.named_children():
            if child is module:
                continue
            path = f"{block_name}.{child_name}"
            if all(isinstance(getattr(child, n, None), nn.Linear) for n in _SHARED_EXPERT_LINEARS):
                _shard_shared(child, path, mesh, plan)
            else:
                for p_name, param in child.named_parameters():
                    _mark(param, f"{path}.{p_name}", ExpertRole.ROUTER, (None,) * param.dim(), mesh, plan)
    return plan


def _is_experts(module: nn.Module) -> bool:
    params = dict(module.named_parameters(recurse=False))
    down, up = params.get("down_proj"), params.get("gate_up_proj", params.get("up_proj"))
    return down is not None and up is not None and down.dim() == 3 and up.dim() == 3


def _shard_routed(module: nn.Module, name: str, mesh: Mesh, plan: ExpertPlan) -> None:
    # (experts, out, in), or (experts, in, out) when transposed: the up projection splits
    # its output (the intermediate dim), the down projection its input.
    transposed = bool(getattr(module, "is_transposed", False))
    tp = plan.tp_axis
    for p_name, param in module.named_parameters(recurse=False):
        if param.dim() == 3:
            up = p_name != "down_proj"
            split_out = up != transposed  # which of the last two dims is the intermediate one
            spec = (plan.expert_axis, tp, None) if split_out else (plan.expert_axis, None, tp)
        elif param.dim() == 2:  # a bias (experts, out): split with the output
            spec = (plan.expert_axis, tp if p_name != "down_proj_bias" else None)
        else:
            spec = (None,) * param.dim()
        _mark(param, f"{name}.{p_name}", ExpertRole.EXPERTS, spec, mesh, plan)


def _shard_shared(mlp: nn.Module, name: str, mesh: Mesh, plan: ExpertPlan) -> None:
    tp = plan.tp_axis
    for linear_name in _SHARED_EXPERT_LINEARS:
        linear = getattr(mlp, linear_name)
        column = linear_name != "down_proj"  # nn.Linear weights are (out, in)
        _mark(linear.weight, f"{name}.{linear_name}.weight", ExpertRole.SHARED_EXPERT,
              (tp, None) if column else (None, tp), mesh, plan)
        if linear.bias is not None:
            _mark(linear.bias, f"{name}.{linear_name}.bias", ExpertRole.SHARED_EXPERT,
                  (tp if column else None,), mesh, plan)


def _mark(param, name: str, role: ExpertRole, spec: tuple, mesh: Mesh, plan: ExpertPlan) -> None:
    mark_sharding(param, mesh, spec)
    plan.parameters.append(ShardedParameter(name, role, tuple(param.shape), spec))
