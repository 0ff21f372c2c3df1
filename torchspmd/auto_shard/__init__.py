"""Automatic sharding: ``torchspmd.auto_shard`` picks every parameter's and the batch's
partition spec from XLA's own cost and memory analysis of candidate layouts.

A planner on top of ``sharding/`` and ``runtime/``: it finds the roles of the parameters
(``roles``), lists candidate layouts (``candidates``), compiles each layer kind's
training program under each (``measure``, ``collectives``), turns XLA's numbers into
predicted time (``cost_model``), solves an integer program (``solve``), prices its best
proposals and the hand-written plans as whole compiled steps (``pricing``, ``whole_step``)
and returns an :class:`AutoShardPlan` (``plan``) that emits ordinary ``mark_sharding`` calls.

Example::

    plan = torchspmd.auto_shard(model, mesh, (x, y), loss_fn=loss_fn)
    print(plan)
    model = plan.apply(model.to("spmd"))
"""

from torchspmd.auto_shard.api import NoPlanFits, Planner, auto_shard, hand_written
from torchspmd.auto_shard.cost_model import CPU, H100, Machine, calibrate, fit
from torchspmd.auto_shard.plan import AutoShardPlan, PlanSummary, PricedPlan

__all__ = ["auto_shard", "Planner", "hand_written", "AutoShardPlan", "PlanSummary", "PricedPlan",
           "NoPlanFits", "Machine", "CPU", "H100", "calibrate", "fit"]
