"""``torchspmd.auto_shard``: measure each candidate layout with XLA, solve, return a plan.

Example::

    mesh = torchspmd.Mesh(np.arange(8), (4, 2), ("data", "model"))
    plan = torchspmd.auto_shard(model, mesh, (x, y), loss_fn=lm_loss,
                                memory_budget=2 * 2**30)
    print(plan)
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import time
from typing import Any, Callable

import jax
import torch
from torch import nn

from torchspmd.auto_shard import candidates as cands
from torchspmd.auto_shard.cost_model import Machine, machine_for
from torchspmd.auto_shard.measure import Programs
from torchspmd.auto_shard.plan import AutoShardPlan, PlanSummary, PricedPlan
from torchspmd.auto_shard.roles import Group, find_groups, repeated_modules
from torchspmd.auto_shard.pricing import Priced, Pricer, plan_key, shard_bytes
from torchspmd.auto_shard.solve import Choice, Option, Solution, solve, smallest_memory
from torchspmd.auto_shard.trials import time_programs
from torchspmd.sharding import Mesh

__all__ = ["auto_shard", "Planner", "NoPlanFits", "hand_written", "HAND_WRITTEN"]


class NoPlanFits(ValueError):
    """No candidate plan's predicted memory per device is within the budget."""


def _slots(optimizer: Any) -> int:
    """Optimizer state tensors per parameter (AdamW's two moments when not given)."""
    if optimizer is None:
        return 2
    kind = optimizer if isinstance(optimizer, type) else type(optimizer)
    if not issubclass(kind, torch.optim.Optimizer):
        raise TypeError(f"torchspmd.auto_shard: optimizer must be a torch.optim.Optimizer or "
                        f"its class, got {type(optimizer).__name__}")
    if issubclass(kind, torch.optim.SGD):
        groups = getattr(optimizer, "param_groups", [{}])
        return int(any(g.get("momentum", 0) for g in groups))
    return 2


def _budget(memory_budget: Any) -> float | None:
    """``memory_budget`` checked: None, or a positive, finite number of bytes."""
    if memory_budget is None:
        return None
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, numbers.Real):
        raise TypeError("torchspmd.auto_shard: memory_budget must be a number of bytes per "
                        f"device (e.g. 2 * 2**30) or None, got {memory_budget!r}")
    if not math.isfinite(memory_budget) or memory_budget <= 0:
        raise ValueError("torchspmd.auto_shard: memory_budget must be a positive number of "
                         f"bytes per device, got {memory_budget!r}")
    return memory_budget


def _inputs(example_inputs: Any) -> tuple:
    """``example_inputs`` as a tuple of positional inputs."""
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if not isinstance(example_inputs, (tuple, list)):
        raise TypeError("torchspmd.auto_shard: example_inputs must be a tensor or a tuple of "
                        "the step's positional inputs (loss_fn(model, *example_inputs)), got "
                        f"{type(example_inputs).__name__}")
    return tuple(example_inputs)


def _itemsize(dtype: str) -> int:
    return torch.empty((), dtype=getattr(torch, dtype)).element_size()


class _Planner:
    def __init__(self, mesh: Mesh, slots: int, machine: Machine):
        self.mesh, self.slots, self.machine = mesh, slots, machine
        self.programs = Programs(mesh, slots)
        self.skipped: list[str] = []  # candidates XLA could not compile, and why

    def layouts(self, group: Group, candidate, batch) -> list[tuple] | None:
        """(layer, position, weight spec, bias spec, activation specs) of one occurrence."""
        layers = group.occurrences[0]
        out = []
        for layer, position in zip(layers, cands.positions(len(layers), group.kind)):
            w = cands.weight_spec(layer, position, candidate, self.mesh)
            acts = cands.activation_specs(layer, position, candidate, batch)
            if w is None or acts is None:
                return None
            out.append((layer, position, w, cands.bias_spec(layer, position, candidate), acts))
        return out

    def choice(self, group: Group, candidate, batch) -> Choice | None:
        layouts = self.layouts(group, candidate, batch)
        if layouts is None:
            return None
        seconds = memory = 0.0
        for layer, position, w, bias, acts in layouts:
            try:
                measured = self.programs.measure(layer, w, acts)
            except Exception as error:  # XLA refused this layout: not a candidate then
                self.skipped.append(f"{group.role} {candidate.name} batch {batch}: "
                                    f"{type(error).__name__}: {str(error)[:200]}")
                return None
            seconds += self.machine.time(measured.flops, measured.bytes_accessed,
                                         measured.collectives)
            item = _itemsize(layer.dtype)
            # XLA's arguments (weight, moments, input, output gradient), the gradient, and
            # the program's temporaries (a gathered weight lives there, and a step keeps it
            # from the forward to the backward): an upper bound, not a tight one.
            memory += (measured.argument_bytes + measured.temp_bytes
                       + shard_bytes(layer.shape, w, item, self.mesh))
            if candidate.fsdp:
                # In a whole step XLA keeps the gathered weight from the forward to the
                # backward and the whole gradient until its reduce-scatter, for every layer
                # at once (its memory analysis of GPT steps shows it): two gathered copies.
                gathered = cands.weight_spec(layer, position,
                                             cands.Candidate(tp=candidate.tp), self.mesh)
                memory += 2 * (shard_bytes(layer.shape, gathered, item, self.mesh)
                               - shard_bytes(layer.shape, w, item, self.mesh))
            if layer.bias is not None:
                memory += (2 + self.slots) * shard_bytes(
                    (layer.shape[layer.out_dim],), bias, item, self.mesh)
        return Choice(candidate.name, seconds * group.count, memory * group.count)


@dataclasses.dataclass
class _Priced:
    """A plan the planner priced: the names it goes by, its summary, specs and price."""

    names: list[str]
    summary: PlanSummary
    specs: dict[str, tuple]
    priced: Priced
    fits: bool  # its whole step's memory is within the budget
    measured_s: float | None = None  # its step run on this machine (``trials``), if it was

    def summary_as_priced(self) -> PlanSummary:
        """Its summary with the whole step's prediction in place of the layer sum's."""
        return dataclasses.replace(self.summary, step_s=self.priced.seconds,
                                   memory_bytes=self.priced.memory_bytes)


HAND_WRITTEN = ("dp", "fsdp", "tp", "fsdp+tp")
# Fitting plans predicted within this factor of the fastest are run to decide (at most
# FINALISTS of them, fastest predicted first): the prediction's error on the
# development machine is up to ~1.3x by plan kind.
FINALISTS_WITHIN = 1.5
FINALISTS = 4
# Finalists measured within this fraction of the fastest are a tie (about the trials'
# run-to-run spread here): of those, the plan needing the least memory wins.
MEASURED_TIE = 0.03
# Plans whose XLA memory is checked against a budget before the planner gives up.
_CHECKS = 4


def hand_written(strategy: str, mesh: Mesh) -> tuple[tuple[str, ...], dict[str, str]]:
    """The batch axes and the candidate name per group kind of a hand-written strategy,
    on a mesh whose last axis is the tensor-parallel one (as ``examples/gpt.py``): ``dp``
    replicates, ``fsdp`` splits every weight over all axes, ``tp`` is Megatron over the
    last axis with the batch over the others, ``fsdp+tp`` adds FSDP over the others.

    Example::

        >>> import torchspmd as xs, numpy as np
        >>> hand_written("tp", xs.Mesh(np.arange(8), (4, 2), ("data", "model")))
        (('data',), {'unit': 'megatron(model)', 'linear': 'replicate', 'embedding': 'replicate'})
    """
    axes = tuple(n for n, size in mesh.shape().items() if size > 1)
    if strategy not in HAND_WRITTEN or (strategy == "fsdp+tp" and len(axes) < 2):
        raise ValueError(f"torchspmd.auto_shard: unknown strategy {strategy!r} for mesh "
                         f"{dict(mesh.shape())}; choose from {HAND_WRITTEN} (fsdp+tp needs "
                         "two mesh axes)")
    tp, rest = axes[-1], axes[:-1]
    every = cands.Candidate(fsdp=axes).name
    names = {"dp": (axes, "replicate", "replicate"),
             "fsdp": (axes, every, every),
             "tp": (rest, cands.Candidate(tp=tp).name, "replicate"),
             "fsdp+tp": (rest, cands.Candidate(tp=tp, fsdp=rest).name,
                         cands.Candidate(fsdp=rest).name)}
    batch, unit, other = names[strategy]
    return batch, {"unit": unit, "linear": other, "embedding": other}


class Planner:
    """Measures every candidate layout of a model once; :meth:`plan` then solves for a
    budget, or prices a hand-written strategy, without compiling again.

    Arguments as :func:`auto_shard`. Example::

        >>> planner = Planner(model, mesh, (x, y), loss_fn=lm_loss)        # doctest: +SKIP
        >>> planner.plan(memory_budget=2**30), planner.plan(strategy="tp")  # doctest: +SKIP
    """

    def __init__(self, model: nn.Module, mesh: Mesh, example_inputs: Any, *,
                 loss_fn: Callable | None = None, optimizer: Any = None,
                 machine: Machine | None = None):
        example_inputs = _inputs(example_inputs)
        batch_tensor = next((t for t in example_inputs
                             if isinstance(t, torch.Tensor) and t.dim() > 0), None)
        if batch_tensor is None:
            raise ValueError("torchspmd.auto_shard: example_inputs needs at least one tensor "
                             "with a batch dim (dim 0)")
        if mesh.axis_names is None:
            raise ValueError("torchspmd.auto_shard: the mesh needs axis names (Mesh(ids, "
                             "shape, ('data', 'model'))): the plan's specs name its axes")
        if not any(p.requires_grad for p in model.parameters()):
            raise ValueError("torchspmd.auto_shard: the model has no trainable parameters, "
                             "so there is nothing to shard")
        slots = _slots(optimizer)
        run = (lambda: loss_fn(model, *example_inputs)) if loss_fn is not None else None
        self.mesh = mesh
        self.groups = find_groups(model, example_inputs, run)
        self.shapes = {n: p.dim() for n, p in model.named_parameters()}
        self.repeated = repeated_modules(model)
        self.machine = machine or machine_for(jax.devices()[0].platform)
        self._measure = _Planner(mesh, slots, self.machine)
        # The compiled steps mark copies on the host, never the caller's tensors (one
        # already on the spmd device keeps its value and its annotation).
        host_inputs = tuple(t.detach().cpu() if isinstance(t, torch.Tensor) else t
                            for t in example_inputs)
        self.pricer = Pricer(model, mesh, host_inputs, loss_fn, self.repeated, slots,
                             self.machine)
        self.options: dict[tuple, Option] = {}
        self.trial_seconds = 0.0  # spent running finalists (``trials``)
        for batch in cands.batch_candidates(mesh, batch_tensor.shape[0]):
            # The replicated plan's whole step: the base every candidate changes.
            replicated_plan = self.pricer.price(batch, {})
            whole = replicated_plan.whole
            per_group = []
            for group in self.groups:
                found = [self._measure.choice(group, c, batch)
                         for c in cands.group_candidates(group.kind, mesh)]
                per_group.append([choice for choice in found if choice is not None])
            # The whole replicated step, then each group's candidate priced as the change
            # from replicating it: base = whole - sum of the replicated choices.
            replicated = [next(c for c in choices if c.name == "replicate")
                          for choices in per_group]
            time = replicated_plan.seconds - sum(c.time for c in replicated)
            memory = replicated_plan.memory_bytes - sum(c.memory for c in replicated)
            self.options[batch] = Option(time, memory, per_group)

    @property
    def programs_compiled(self) -> int:
        """How many layer programs XLA compiled to measure the candidates."""
        return self._measure.programs.compiled

    def plan(self, memory_budget: float | None = None, strategy: str | None = None,
             measure: bool = True) -> AutoShardPlan:
        """The fastest plan within ``memory_budget`` bytes per device, or (with
        ``strategy``, one of ``dp``/``fsdp``/``tp``/``fsdp+tp``) that hand-written plan
        with its prediction. Raises :class:`NoPlanFits` when none fits.

        The integer program proposes its best plan; it and the hand-written plans
        are then priced as the programs they become (``pricing.py``: each plan's whole
        step compiled). With ``measure`` the plans that fit and are predicted within
        ``FINALISTS_WITHIN`` of the fastest are run on zeros in turn (``trials.py``) and
        the fastest measured wins (of those within ``MEASURED_TIE`` of it, the one
        needing the least memory); without it the fastest predicted, and nothing runs."""
        memory_budget = _budget(memory_budget)
        if strategy is not None:
            pool = [(strategy, self._hand_written(strategy))]
        else:
            proposed = self._proposed(memory_budget)
            pool = [(f"integer program {k}", s) for k, s in enumerate(proposed, 1)]
            for name in HAND_WRITTEN:
                try:
                    pool.append((name, self._hand_written(name)))
                except ValueError:  # the mesh or the batch does not allow it
                    continue
        found: dict[tuple, _Priced] = {}  # one entry per distinct plan
        for name, summary in pool:
            specs = self._specs(summary)
            key = plan_key(summary.batch, specs)
            if key in found:
                found[key].names.append(name)
                continue
            priced = self.pricer.price(summary.batch, specs)
            found[key] = _Priced([name], summary, specs, priced, memory_budget is None
                                 or priced.memory_bytes <= memory_budget)
        # Fitting plans first, each group fastest first; a stable sort keeps the integer
        # program's order, then HAND_WRITTEN's, on equal predictions.
        ranked = sorted(found.values(), key=lambda e: (not e.fits, e.priced.seconds))
        if not ranked[0].fits:
            self._no_plan_fits(memory_budget, [s for _, s in pool])
        if measure and strategy is None:
            ranked = self._by_trials(ranked)
        best, runner_up = ranked[0], ranked[1] if len(ranked) > 1 and ranked[1].fits else None
        mesh = self.mesh
        return AutoShardPlan([int(d) for d in mesh.device_ids], tuple(mesh.mesh_shape),
                             tuple(mesh.axis_names), best.specs, best.summary_as_priced(),
                             runner_up.summary_as_priced() if runner_up else None,
                             best.priced.collectives, self.repeated, memory_budget,
                             self.machine.name,
                             [PricedPlan(" = ".join(e.names), e.priced.seconds,
                                         e.priced.memory_bytes, e.fits, e.measured_s)
                              for e in ranked])

    def _by_trials(self, ranked: list[_Priced]) -> list[_Priced]:
        """``ranked`` (fitting plans first, fastest predicted first) reordered by running
        the finalists: the fitting plans predicted within ``FINALISTS_WITHIN`` of the
        fastest, the ``FINALISTS`` fastest of them, get ``measured_s`` (their forward and
        backward run on this machine, plus the optimizer update's predicted time: an
        elementwise pass over the state, which compiled into each program would double
        the planner's compile time, see ``docs/guides/auto-shard.md``). They come first,
        fastest measured first, except that of those within ``MEASURED_TIE`` of the
        fastest the one needing the least memory leads; then the rest as they were."""
        fastest = ranked[0].priced.seconds
        finalists = [e for e in ranked
                     if e.fits and e.priced.seconds <= FINALISTS_WITHIN * fastest][:FINALISTS]
        if len(finalists) < 2:
            return ranked
        start = time.perf_counter()
        seconds = time_programs([e.priced.whole.program for e in finalists])
        self.trial_seconds += time.perf_counter() - start
        for entry, ran in zip(finalists, seconds):
            entry.measured_s = ran + self.machine.time(0.0, entry.priced.update_bytes, ())
        finalists.sort(key=lambda e: e.measured_s)
        tie = (1 + MEASURED_TIE) * finalists[0].measured_s
        tied = [e for e in finalists if e.measured_s <= tie]
        lightest = min(tied, key=lambda e: e.priced.memory_bytes)
        finalists.remove(lightest)
        return [lightest, *finalists, *(e for e in ranked if e.measured_s is None)]

    def _hand_written(self, strategy: str) -> PlanSummary:
        """A hand-written strategy as a plan of this model (ValueError if it cannot be)."""
        batch, names = hand_written(strategy, self.mesh)
        if batch not in self.options:
            raise ValueError(f"torchspmd.auto_shard: strategy {strategy!r} splits the "
                             f"batch over {batch}, which does not divide it")
        option = self.options[batch]
        only = [[c for c in choices if c.name == names[g.kind]]
                for g, choices in zip(self.groups, option.groups)]
        lacking = [f"{g.role} ({names[g.kind]})" for g, choices in zip(self.groups, only)
                   if not choices]
        if lacking:  # the layout does not apply to a group, or XLA refused it
            raise ValueError(
                f"torchspmd.auto_shard: strategy {strategy!r} is not a plan of this model: "
                f"no layout of it for {', '.join(lacking)}"
                + (f" (XLA refused: {'; '.join(self._measure.skipped[:2])})"
                   if self._measure.skipped else ""))
        (solution,) = solve({",".join(batch): Option(option.time, option.memory, only)},
                            None, solutions=1)
        return self._summary(solution)

    def _summary(self, solution: Solution) -> PlanSummary:
        batch = next(b for b in self.options if ",".join(b) == solution.batch)
        return PlanSummary(batch, {g.role: c for g, c in zip(self.groups, solution.choices)},
                           solution.time, solution.memory)

    @property
    def _named(self) -> dict[str, Option]:
        """The options keyed as ``solve`` names batch layouts (``"data,model"``)."""
        return {",".join(b): o for b, o in self.options.items()}

    def _proposed(self, memory_budget: float | None) -> list[PlanSummary]:
        """The integer program's best plan for the budget (its second best is most often
        the same plan with one small layer laid out otherwise: not worth a whole step's
        compile). Its memory adds up layers; with a budget XLA has the last word: a
        proposal whose whole step needs more is cut from the program, which is solved
        again (a few times at most); if none of those fit, the least-memory plan."""
        named = self._named
        found = solve(named, memory_budget, solutions=1)
        checked: list[Solution] = []
        while found and memory_budget is not None:
            if self._priced(self._summary(found[0])).memory_bytes <= memory_budget:
                break
            checked.append(found[0])
            found = (solve(named, memory_budget, solutions=1, excluded=tuple(checked))
                     if len(checked) < _CHECKS else [])
        if not found:
            found = solve(named, None, solutions=1, minimize="memory")
        return [self._summary(s) for s in found]

    def _priced(self, summary: PlanSummary) -> Priced:
        return self.pricer.price(summary.batch, self._specs(summary))

    def _no_plan_fits(self, memory_budget: float, pool: list[PlanSummary]) -> None:
        # XLA's least among the plans tried (the least-memory plan among them), never
        # below the integer program's own least.
        need = max(smallest_memory(self._named), min(self._priced(s).memory_bytes for s in pool))
        raise NoPlanFits(
            f"torchspmd.auto_shard: no plan fits memory_budget={memory_budget:.0f} bytes "
            f"per device; the smallest any candidate plan needs is {need:.0f} bytes "
            f"({need / 2**20:.2f} MiB), as XLA's memory analysis of its compiled step "
            "says. Raise the budget, use a larger mesh, or a smaller batch.")

    def _specs(self, best: PlanSummary) -> dict[str, tuple]:
        specs: dict[str, tuple] = {n: (None,) * dim for n, dim in self.shapes.items()}
        for group in self.groups:
            candidate = next(c for c in cands.group_candidates(group.kind, self.mesh)
                             if c.name == best.choices[group.role])
            for occurrence in group.occurrences:
                for layer, position in zip(occurrence,
                                           cands.positions(len(occurrence), group.kind)):
                    specs[layer.weight] = cands.weight_spec(layer, position, candidate,
                                                            self.mesh)
                    if layer.bias is not None:
                        specs[layer.bias] = cands.bias_spec(layer, position, candidate)
        return specs


def auto_shard(model: nn.Module, mesh: Mesh, example_inputs: Any, *,
               loss_fn: Callable | None = None, optimizer: Any = None,
               memory_budget: float | None = None,
               machine: Machine | None = None, measure: bool = True) -> AutoShardPlan:
    """Pick a partition spec for every parameter of ``model`` and for the batch.

    ``example_inputs``: a tensor or tuple of the step's inputs (dim 0 is the batch);
    one forward runs on them (``loss_fn(model, *example_inputs)``, or
    ``model(*example_inputs)``) under ``no_grad`` to read layer shapes. Each candidate
    layout of each layer kind is compiled by XLA (forward, backward and the optimizer
    update; nothing runs) and its cost and memory analysis and collectives become a
    predicted time (``machine``, default from the platform:
    :mod:`torchspmd.auto_shard.cost_model`); an integer program proposes its best
    plan whose predicted memory per device is within ``memory_budget`` bytes. It and
    the hand-written plans (dp, fsdp, tp, fsdp+tp) are compiled as whole steps and priced;
    with ``measure`` (the default) the ones that fit and are predicted within 1.5x of the
    fastest then run on zero-filled inputs a few times each (seconds in all; the model is
    untouched) and the fastest measured wins (of those within 3% of it, the one needing
    the least memory); ``measure=False`` picks by prediction and
    runs nothing. ``optimizer`` (an instance or class; default AdamW) sets how many state
    tensors each parameter has. Raises :class:`NoPlanFits` naming the smallest memory any
    plan needs.

    Example::

        >>> plan = auto_shard(model, mesh, (x, y), loss_fn=lm_loss)   # doctest: +SKIP
        >>> model = plan.apply(model.to("spmd"))                      # doctest: +SKIP
    """
    memory_budget = _budget(memory_budget)  # before seconds of compiling, not after
    return Planner(model, mesh, example_inputs, loss_fn=loss_fn, optimizer=optimizer,
                   machine=machine).plan(memory_budget, measure=measure)
