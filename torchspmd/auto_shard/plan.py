"""The planner's answer: a partition spec per parameter and for the batch, and why.

``print(plan)`` shows the table (role, choice, parameter specs), the predicted (and,
where the planner ran it, measured) step time, memory per device and collectives per
step, the runner-up with its predicted cost, and every plan compared;
``plan.apply(model)`` marks the shardings with ordinary ``mark_sharding`` calls;
``plan.to_json()`` / ``AutoShardPlan.from_json(text)`` save and reuse it.

Example::

    plan = torchspmd.auto_shard(model, mesh, (x, y), loss_fn=loss)
    print(plan)
    model = plan.apply(model.to("spmd"))
    x, y = plan.shard_batch(x.to("spmd"), y.to("spmd"))
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import torch
from torch import nn

from torchspmd.auto_shard.candidates import axes_entry
from torchspmd.sharding import Mesh, mark_sharding

__all__ = ["AutoShardPlan", "PlanSummary", "PricedPlan"]


@dataclasses.dataclass(frozen=True)
class PlanSummary:
    """A plan's batch axes, choice per role, predicted seconds per step and bytes per device."""

    batch: tuple[str, ...]
    choices: dict[str, str]
    step_s: float
    memory_bytes: float


@dataclasses.dataclass(frozen=True)
class PricedPlan:
    """One plan the planner compiled and priced: which (``dp``, ``integer program 1``,
    ...), its predicted seconds per step and bytes per device, whether it fits the
    budget, and its seconds per step when the planner ran it (``None`` if it did not)."""

    name: str
    step_s: float
    memory_bytes: float
    fits: bool
    measured_s: float | None = None


def _spec_to_json(spec: tuple) -> list:
    return [list(e) if isinstance(e, tuple) else e for e in spec]


def _spec_from_json(spec: list) -> tuple:
    return tuple(tuple(e) if isinstance(e, list) else e for e in spec)


@dataclasses.dataclass
class AutoShardPlan:
    """A sharding plan for one model on one mesh (see :func:`torchspmd.auto_shard`).

    ``specs``: parameter name -> partition spec (every parameter of the model);
    ``best``/``runner_up``: :class:`PlanSummary` of the chosen and the second-best plan;
    ``collectives``: predicted collectives per step by kind; ``repeated``: the containers
    of repeated layers whose outputs :meth:`apply` keeps split on the batch dim;
    ``priced``: every plan compared as a whole compiled step (:class:`PricedPlan`), the
    chosen one first among those that fit.

    Example::

        >>> plan = AutoShardPlan.from_json(plan_json)          # doctest: +SKIP
        >>> model = plan.apply(model.to("spmd"))               # doctest: +SKIP
    """

    mesh_devices: list[int]
    mesh_shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    specs: dict[str, tuple]
    best: PlanSummary
    runner_up: PlanSummary | None
    collectives: dict[str, int]
    repeated: list[str]
    memory_budget: float | None
    machine: str
    priced: list[PricedPlan] = dataclasses.field(default_factory=list)

    @property
    def mesh(self) -> Mesh:
        """The mesh the plan is for."""
        return Mesh(np.array(self.mesh_devices), self.mesh_shape, self.axis_names)

    @property
    def predicted_step_ms(self) -> float:
        return self.best.step_s * 1e3

    @property
    def predicted_memory_bytes(self) -> float:
        return self.best.memory_bytes

    @property
    def measured_step_ms(self) -> float | None:
        """The chosen plan's step as the planner ran it (``None`` if it ran none)."""
        chosen = self.priced[0] if self.priced else None
        return None if chosen is None or chosen.measured_s is None else chosen.measured_s * 1e3

    def batch_spec(self, ndim: int) -> tuple:
        """The partition spec of an input of rank ``ndim`` (its dim 0 is the batch).

        Example::

            >>> plan.batch_spec(2)                             # doctest: +SKIP
            ('data', None)
        """
        return (axes_entry(self.best.batch),) + (None,) * (ndim - 1)

    def shard_batch(self, *tensors: torch.Tensor) -> Any:
        """``mark_sharding`` each spmd tensor on its batch dim; returns them (one: itself)."""
        mesh = self.mesh
        for t in tensors:
            mark_sharding(t, mesh, self.batch_spec(t.dim()))
        return tensors[0] if len(tensors) == 1 else tensors

    def apply(self, model: nn.Module) -> nn.Module:
        """Mark every parameter of ``model`` (on the spmd device) with its spec, and keep
        each repeated layer's output split on the batch dim; returns ``model``.

        Example::

            >>> model = plan.apply(model.to("spmd"))           # doctest: +SKIP
        """
        mesh = self.mesh
        names = dict(model.named_parameters())
        unknown = sorted(set(names) - set(self.specs))
        missing = sorted(set(self.specs) - set(names))
        if unknown or missing:
            raise ValueError(
                "torchspmd.auto_shard: this plan was made for another model: "
                + "; ".join(f"{what} {', '.join(repr(n) for n in found[:3])}"
                            + (f" and {len(found) - 3} more" if len(found) > 3 else "")
                            for what, found in (("the plan has no spec for", unknown),
                                                ("the model has no parameter", missing))
                            if found)
                + ". Plan again for this model: torchspmd.auto_shard(model, mesh, inputs, ...)")
        for name, p in names.items():
            if p.device.type != "spmd":
                raise ValueError(f"torchspmd.auto_shard: plan.apply needs the model on the "
                                 f"spmd device, but parameter {name!r} is on {p.device}; "
                                 f"call plan.apply(model.to('spmd'))")
            mark_sharding(p, mesh, self.specs.get(name, (None,) * p.dim()))
        for container in self.repeated:
            for layer in model.get_submodule(container):
                layer.register_forward_hook(self._constrain_output)
        return model

    def _constrain_output(self, module, inputs, output) -> None:
        first = output[0] if isinstance(output, (tuple, list)) and output else output
        if isinstance(first, torch.Tensor) and first.dim() > 0 and \
                first.shape[0] % int(np.prod([dict(zip(self.axis_names, self.mesh_shape))[a]
                                              for a in self.best.batch])) == 0:
            mark_sharding(first, self.mesh, self.batch_spec(first.dim()))

    def _role(self, name: str) -> str:
        for container in sorted(self.repeated, key=len, reverse=True):
            head, _, rest = name.partition(container + ".")
            index, dot, tail = rest.partition(".")
            if not head and index.isdigit():
                return f"{container}.*{dot}{tail}"
        return name

    def to_json(self) -> str:
        """The plan as JSON text (:meth:`from_json` reads it back)."""
        data = dataclasses.asdict(self)
        data["specs"] = {k: _spec_to_json(v) for k, v in self.specs.items()}
        return json.dumps(data, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> AutoShardPlan:
        """A plan saved by :meth:`to_json`.

        Example::

            >>> AutoShardPlan.from_json(plan.to_json()) == plan   # doctest: +SKIP
            True
        """
        def summary(d):
            return None if d is None else PlanSummary(tuple(d["batch"]), d["choices"],
                                                      d["step_s"], d["memory_bytes"])

        try:
            data = json.loads(text)
            return cls(data["mesh_devices"], tuple(data["mesh_shape"]),
                       tuple(data["axis_names"]),
                       {k: _spec_from_json(v) for k, v in data["specs"].items()},
                       summary(data["best"]), summary(data["runner_up"]),
                       data["collectives"], data["repeated"], data["memory_budget"],
                       data["machine"], [PricedPlan(**p) for p in data.get("priced", [])])
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            detail = f"no {error}" if isinstance(error, KeyError) else str(error)
            raise ValueError("torchspmd.AutoShardPlan.from_json: the text is not a plan "
                             f"saved by plan.to_json() ({detail})") from None

    def __str__(self) -> str:
        mib = 2 ** 20
        lines = [f"AutoShardPlan on mesh {dict(zip(self.axis_names, self.mesh_shape))} "
                 f"({self.machine} machine model)",
                 f"  batch: dim 0 over {self.best.batch or 'nothing (replicated)'}"]
        rows: dict[tuple[str, tuple], int] = {}  # repeated layers' parameters shown once
        for name, spec in self.specs.items():
            key = (self._role(name), spec)
            rows[key] = rows.get(key, 0) + 1
        width = max([len(r) for r, _ in rows] + [9])
        lines.append(f"  {'parameter':<{width}}  {'layers':>6}  spec")
        for (role, spec), count in rows.items():
            lines.append(f"  {role:<{width}}  {count:>6}  {spec}")
        lines.append(f"  choices: " + ", ".join(f"{r}: {c}" for r, c in self.best.choices.items()))
        budget = "none" if self.memory_budget is None else f"{self.memory_budget / mib:.2f} MiB"
        measured = self.measured_step_ms
        lines.append(f"  predicted step: {self.best.step_s * 1e3:.2f} ms"
                     + (f" (measured {measured:.2f} ms)" if measured is not None else "")
                     + f"; memory/device: {self.best.memory_bytes / mib:.2f} MiB "
                     f"(budget {budget})")
        lines.append("  collectives/step: " + (", ".join(
            f"{k} {v}" for k, v in self.collectives.items() if v) or "none"))
        if self.runner_up is not None:
            changed = {r: c for r, c in self.runner_up.choices.items()
                       if self.best.choices.get(r) != c}
            lines.append(f"  runner-up: {self.runner_up.step_s * 1e3:.2f} ms, "
                         f"{self.runner_up.memory_bytes / mib:.2f} MiB; batch over "
                         f"{self.runner_up.batch or 'nothing'}; differs in "
                         + (", ".join(f"{r}: {c}" for r, c in changed.items()) or "batch only"))
        if self.priced:
            ran = any(p.measured_s is not None for p in self.priced)
            lines.append("  plans compared (each compiled as a whole step"
                         + ("; the finalists run, the fastest measured chosen):" if ran
                            else "; the fastest predicted chosen):"))
            width = max(len(p.name) for p in self.priced)
            lines.append(f"    {'plan':<{width}}  {'predicted':>9}  "
                         + (f"{'measured':>9}  " if ran else "") + f"{'memory':>10}")
            for k, p in enumerate(self.priced):
                mark = ("  <- chosen" if k == 0 and p.fits else
                        "" if p.fits else "  (over the budget)")
                measured = ("" if not ran else f"{'-':>9}  " if p.measured_s is None
                            else f"{p.measured_s * 1e3:6.2f} ms  ")
                lines.append(f"    {p.name:<{width}}  {p.step_s * 1e3:6.2f} ms  {measured}"
                             f"{p.memory_bytes / mib:6.2f} MiB{mark}")
        return "\n".join(lines)
