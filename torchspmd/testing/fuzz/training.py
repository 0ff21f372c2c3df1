"""Fuzz programs that train: a small model, random shardings, a compiled or lazy step.

The model (Linear, an activation, maybe LayerNorm, Linear), its parameters' and the
batch's shardings, the optimizer (SGD with momentum, Adam, AdamW), a learning-rate
schedule, and what happens between steps (reads, a checkpoint saved and loaded back into
the parameters, an op that fails, a step that runs out of memory) are drawn at random.
The step is ``torchspmd.compile``-d or runs lazily with ``sync()``, maybe keeping a copy of
a parameter from before its update and a running average; it gets the same batch,
two batches in turn, or one tensor as input and target then two; between steps the
program may change a hyperparameter, the learning rate, the optimizer's state or a
parameter by hand. A compiled step is then called three more times with nothing in
between (``xs.settled``: the third call must not capture again). Every parameter, its
gradient and the last loss are compared with CPU's. Example::

    >>> program = training_program(rng, builder)   # lines written into ``builder``
"""

from __future__ import annotations

import random

import torch

from torchspmd.testing.fuzz import flow

_ACTIVATIONS = ("torch.nn.GELU()", "torch.nn.ReLU()", "torch.nn.Tanh()")
_OPTIMIZERS = ("torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)",
               "torch.optim.Adam(model.parameters(), lr=0.01)",
               "torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)",
               # fused: one op per step (``lowering/fused_optimizers.py``)
               "torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, fused=True)",
               "torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1, fused=True)")


# What the loop may do after each step, with each line's chance: reads, a checkpoint, a
# failure; then changes by hand: a hyperparameter once (later calls replay the step
# captured with it), the learning rate as a Python float, the optimizer's state, a
# parameter.
_BETWEEN_STEPS = (
    (0.5, "xs.read(loss)"),
    (0.2, "xs.checkpoint(model.state_dict())"),
    (0.15, "xs.attempt(lambda: model(torch.ones(1, 3, device=dev)))"),
    (0.1, "oom = xs.out_of_memory()"),
    (0.15, "if step == 1: xs.set_weight_decay(opt, 0.05)"),
    (0.15, 'for g in opt.param_groups: g["lr"] = g["lr"] * 0.5'),
    (0.15, "xs.edit_state(opt)"),
    (0.15, "xs.edit_parameter(model)"),
)


def _between_steps(rng: random.Random) -> list[str]:
    """The lines the loop runs after each step (``_BETWEEN_STEPS``, each drawn in turn)."""
    return [line for chance, line in _BETWEEN_STEPS if rng.random() < chance]


def _step_arguments(b, rng: random.Random, mesh, x: str, y: str, x_spec) -> str:
    """The step's arguments each iteration: the same batch; two batches in turn; or, when
    the shapes allow, the input passed as the target too for two steps (the first may be a
    warm-up, the second captured), then two tensors."""
    kind = rng.choice(("same", "alternate", "twice"))
    if kind == "twice" and b.env[x].shape == b.env[y].shape:
        return f"{x}, ({x}, {y})[step >= 2]"
    if kind == "same":
        return f"{x}, {y}"
    x2 = b.fresh(tuple(b.env[x].shape), torch.float32)
    if x_spec is not None:
        b.emit(f"xs.mark_sharding({x2}, {mesh.name}, {rng.choice((x_spec, b.spec(mesh, 2)))!r})")
    return f"({x}, {x2})[step % 2], {y}"


def training_program(b, rng: random.Random) -> None:
    """Write a training program's lines into ``b`` (whose first mesh is ``m0``)."""
    mesh = b.meshes[0]
    width_in, hidden, width_out = (rng.choice((4, 8, 16)) for _ in range(3))
    batch = rng.choice((4, 8, 16))
    layers = [f"torch.nn.Linear({width_in}, {hidden})", rng.choice(_ACTIVATIONS)]
    if rng.random() < 0.4:
        layers.append(f"torch.nn.LayerNorm({hidden})")
    layers.append(f"torch.nn.Linear({hidden}, {width_out})")
    b.emit(f"torch.manual_seed({rng.randrange(1000)})")
    b.emit(f"model = torch.nn.Sequential({', '.join(layers)}).to(dev)")
    for name, p in b.env["model"].named_parameters():
        if rng.random() < 0.6:
            b.emit(f"xs.mark_sharding(model.get_parameter({name!r}), {mesh.name}, "
                   f"{b.spec(mesh, p.dim())!r})")
    b.emit(f"opt = {rng.choice(_OPTIMIZERS)}")
    scheduled = rng.random() < 0.4
    if scheduled:
        b.emit("sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)")
    x = b.fresh((batch, width_in), torch.float32)
    y = b.fresh((batch, width_out), torch.float32)
    x_spec = b.spec(mesh, 2) if rng.random() < 0.7 else None
    if x_spec is not None:
        b.emit(f"xs.mark_sharding({x}, {mesh.name}, {x_spec!r})")
    # Maybe state the step keeps besides the model's: the first parameter as it was before
    # the update (a zero-copy copy_ of what the update then overwrites) and an average.
    kept = rng.random() < 0.3
    if kept:
        b.emit("before = torch.zeros_like(next(model.parameters()))")
        b.emit("average = torch.zeros_like(next(model.parameters()))")
    b.emit("def train_step(x, y):\n"
           "    opt.zero_grad()\n"
           "    loss = torch.nn.functional.mse_loss(model(x / 4), y / 4)\n"
           "    loss.backward()\n"
           + ("    before.copy_(next(model.parameters()))\n" if kept else "")
           + "    opt.step()\n"
           + ("    with torch.no_grad():\n"
              "        average.mul_(0.5).add_(next(model.parameters()), alpha=0.5)\n"
              if kept else "")
           + "    return loss")
    compiled = rng.random() < 0.7
    b.emit("step_fn = xs.compile(train_step)" if compiled else "step_fn = train_step")
    arguments = _step_arguments(b, rng, mesh, x, y, x_spec)
    body = [f"loss = step_fn({arguments})"]
    if not compiled:
        body.append("xs.sync()")
    if scheduled:
        body.append("sched.step()")
    body += _between_steps(rng)
    steps = rng.randint(2, 4)
    b.emit(f"for step in range({steps}):\n" + "\n".join("    " + line for line in body))
    if compiled:  # three more calls with nothing in between: the third must replay
        b.emit(f"loss = xs.settled(lambda: step_fn({arguments}))")
    b.assign("loss.detach()")
    if kept:
        b.assign("before")
        b.assign("average")
    for name, p in b.env["model"].named_parameters():
        b.assign(f"model.get_parameter({name!r}).detach()")
        if p.grad is not None:
            b.assign(f"model.get_parameter({name!r}).grad")
    if rng.random() < 0.3:  # and work after the training, on what it produced
        flow.read(b)
