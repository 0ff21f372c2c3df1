"""The three trainers ``train_step.py`` times: the lazy path, ``torchspmd.compile`` and
the same model and AdamW written in JAX, each ``step(i, x, y) -> loss`` from the same
weights, recording how long the host took until its step call returned.

Example::

    step = compiled_trainer(build_model(args), total=35, layout=None)
    loss = step(0, x, y)           # step.phases[-1]: (host seconds, wait seconds)
"""

from __future__ import annotations

import copy
import time

import jax
import torch

import torchspmd
from torchspmd.debug.hlo import collectives
from torchspmd.runtime.execute import last_program
from torchspmd.sharding.partition_spec import named_sharding
from torchspmd.testing.models import TinyTransformer, lm_loss

# Siblings in benchmarks/ (train_step.py puts the folder on the path).
import jax_transformer as jt  # noqa: E402
from bench_layouts import Layout  # noqa: E402

BASE_LR = 1e-2  # as torchspmd.testing.models.train
WEIGHT_DECAY = 0.1


def build_model(args) -> TinyTransformer:
    torch.manual_seed(0)
    return TinyTransformer(vocab=args.vocab, dim=args.dim, heads=args.heads,
                           layers=args.layers, seq=args.seq,
                           attention=getattr(args, "attention", True))


def lr_at(step: int, total: int) -> float:
    """The schedule of ``models.train``: a Python number each step (must not recompile)."""
    return BASE_LR * (1 - step / (2 * total))


# --- torchspmd side ------------------------------------------------------------------

def place_torch(model: TinyTransformer, layout: Layout | None = None) -> TinyTransformer:
    """The module on the spmd device, each parameter marked with its layout's spec."""
    model = model.to(torchspmd.device())
    if layout is not None:
        for name, p in model.named_parameters():
            torchspmd.mark_sharding(p, layout.mesh, layout.spec(name, p.shape))
    return model


def torchspmd_trainer(model: TinyTransformer, total: int, layout: Layout | None = None):
    """``step(i, x, y) -> loss``: one traced, synced and waited-for training step.

    The returned function records per-step phases in ``step.phases``: seconds in user
    code while tracing (``opt.step()`` launches the program: graph collection and launch
    are in it), in the ``sync()`` after it (little or nothing left), and waiting for the
    device and reading the loss; then the calling thread's CPU seconds of the first two
    (the launched program computes on other threads), which a loaded machine disturbs
    less than wall time.
    """
    model = place_torch(copy.deepcopy(model), layout)
    opt = torch.optim.AdamW(model.parameters(), lr=BASE_LR, weight_decay=WEIGHT_DECAY)
    device = torchspmd.device()
    phases: list[tuple[float, float, float, float]] = []

    def step(i: int, x: torch.Tensor, y: torch.Tensor) -> float:
        start = time.perf_counter()
        # The host thread's CPU time: opt.step() launches the step's program
        # (device/step_boundary.py), whose XLA threads a process time would count too.
        cpu_start = time.thread_time()
        for group in opt.param_groups:
            group["lr"] = lr_at(i, total)
        x, y = x.to(device), y.to(device)
        if layout is not None:
            torchspmd.mark_sharding(x, layout.mesh, layout.batch)
            torchspmd.mark_sharding(y, layout.mesh, layout.batch)
        opt.zero_grad()
        loss = lm_loss(model, x, y)
        loss.backward()
        opt.step()
        traced = time.perf_counter()
        torchspmd.sync()
        launched = time.perf_counter()
        cpu = time.thread_time() - cpu_start
        step.program = last_program()  # the step's graph, for its collectives
        torchspmd.wait_device_ops()
        value = loss.item()
        phases.append((traced - start, launched - traced, time.perf_counter() - launched, cpu))
        return value

    step.phases = phases
    step.program = None
    return step


def compiled_trainer(model: TinyTransformer, total: int, layout: Layout | None = None):
    """``step(i, x, y) -> loss`` through ``torchspmd.compile``: captured once, then one
    jitted call per step. ``step.phases`` holds (host seconds until the call returned,
    seconds waiting for the loss, the host thread's CPU seconds until the call returned)."""
    model = place_torch(copy.deepcopy(model), layout)
    opt = torch.optim.AdamW(model.parameters(), lr=BASE_LR, weight_decay=WEIGHT_DECAY)
    device = torchspmd.device()
    phases: list[tuple[float, float]] = []

    @torchspmd.compile
    def train(x, y):
        opt.zero_grad()
        loss = lm_loss(model, x, y)
        loss.backward()
        opt.step()
        return loss

    def launch(i: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Start step ``i`` and return its loss without waiting for it."""
        for group in opt.param_groups:
            group["lr"] = lr_at(i, total)  # a float by hand: copied into Adam's lr scalar
        x, y = x.to(device), y.to(device)
        if layout is not None:  # uploaded straight into the batch layout
            torchspmd.mark_sharding(x, layout.mesh, layout.batch)
            torchspmd.mark_sharding(y, layout.mesh, layout.batch)
        return train(x, y)

    def step(i: int, x: torch.Tensor, y: torch.Tensor) -> float:
        start, cpu_start = time.perf_counter(), time.thread_time()
        loss = launch(i, x, y)
        launched, cpu = time.perf_counter(), time.thread_time() - cpu_start
        value = loss.item()
        phases.append((launched - start, time.perf_counter() - launched, cpu))
        return value

    step.phases = phases
    step.compiled = train
    step.optimizer = opt
    step.launch, step.wait = launch, lambda loss: loss.item()
    return step


# --- JAX side ------------------------------------------------------------------------

def place_jax(tree: dict, layout: Layout | None = None) -> dict:
    """Parameters (or one AdamW moment), keyed by state_dict name, on JAX's devices,
    committed, as the step's outputs will be (an uncommitted input would make the second
    call compile again); with a layout, each leaf gets its name's NamedSharding."""
    if layout is None:
        return jax.device_put(tree, jax.devices()[0])
    return {name: jax.device_put(v, layout.jax_sharding(name, v.shape))
            for name, v in tree.items()}


def place_jax_opt(opt: dict, layout: Layout | None = None) -> dict:
    """AdamW state: both moments laid out like their parameters, the step count replicated."""
    if layout is None:
        return place_jax(opt)
    return {"step": jax.device_put(opt["step"], named_sharding(layout.mesh, ())),
            "exp_avg": place_jax(opt["exp_avg"], layout),
            "exp_avg_sq": place_jax(opt["exp_avg_sq"], layout)}


def jax_trainer(model: TinyTransformer, total: int, heads: int, layout: Layout | None = None):
    """``step(i, x, y) -> loss`` for the pure-JAX model, from the module's own weights."""
    params = place_jax(jt.params_from_torch(model.state_dict()), layout)
    state = {"params": params, "opt": place_jax_opt(jt.adamw_init(params), layout)}
    # With a layout, the updated state comes back in the layout it went in with, as a
    # marked torchspmd tensor keeps its sharding across in-place updates.
    out_shardings = None if layout is None else (
        jax.tree.map(lambda a: a.sharding, (state["params"], state["opt"]))
        + (named_sharding(layout.mesh, ()),))
    train_step = jt.make_train_step(heads=heads, weight_decay=WEIGHT_DECAY,
                                    out_shardings=out_shardings)
    batch_target = (jax.devices()[0] if layout is None
                    else named_sharding(layout.mesh, layout.batch))

    def launch(i: int, x: torch.Tensor, y: torch.Tensor) -> jax.Array:
        """Start step ``i`` and return its loss without waiting for it."""
        # The batch goes host -> device inside the step, as x.to("spmd") does on the
        # other side (with a layout: straight into its batch sharding).
        x, y = jax.device_put((x.numpy(), y.numpy()), batch_target)
        lr = jt.as_lr(lr_at(i, total))
        step.last_args = (x, y, lr)
        state["params"], state["opt"], loss = train_step(state["params"], state["opt"], x, y, lr)
        return loss

    def wait(loss: jax.Array) -> float:
        jax.block_until_ready((state["params"], state["opt"]))
        return float(loss)

    def step(i: int, x: torch.Tensor, y: torch.Tensor) -> float:
        start, cpu_start = time.perf_counter(), time.thread_time()
        loss = launch(i, x, y)
        step.host.append(time.perf_counter() - start)
        step.host_cpu.append(time.thread_time() - cpu_start)
        return wait(loss)

    step.host = []
    step.host_cpu = []  # the host thread's CPU seconds until the call returned
    step.jitted = train_step
    step.state = state
    step.launch, step.wait = launch, wait
    return step


def pipelined_ms(trainer, data, steps: int) -> float:
    """Milliseconds per step when ``steps`` steps are launched back to back and only the
    last is waited for (a loop that reads its loss every N steps): the host's work
    overlaps the device's, so this is the device's time per step unless the host is slower.
    ``trainer`` has ``launch``/``wait`` (``compiled_trainer``, ``jax_trainer``)."""
    batches = list(data)[:steps]
    start = time.perf_counter()
    for i, (x, y) in enumerate(batches):
        out = trainer.launch(i, x, y)
    trainer.wait(out)
    return (time.perf_counter() - start) / len(batches) * 1e3


def jax_compiled(jax_step):
    """JAX's step compiled again (lowered from the last call's arguments; not timed)."""
    x, y, lr = jax_step.last_args
    return jax_step.jitted.lower(jax_step.state["params"], jax_step.state["opt"],
                                 x, y, lr).compile()


def jax_collectives(jax_step) -> dict[str, int]:
    """Collectives in JAX's compiled step."""
    return collectives(jax_compiled(jax_step).as_text())


# --- timing ----------------------------------------------------------------------------

def run_interleaved(trainers: dict, data: list, warmup: int, steps: int) -> dict:
    """Run every trainer's step ``warmup + steps`` times, alternating between trainers.

    Alternating step by step (not one side after the other) makes both sides see the
    same background load, so their ratio holds up on a busy machine. Returns, per name,
    the losses of all steps and the wall times of the timed ones.
    """
    out = {name: {"losses": [], "times": []} for name in trainers}
    marks = {}
    for i, (x, y) in enumerate(data[: warmup + steps]):
        if i == warmup:
            marks = torchspmd.metrics()
        for name, step in trainers.items():
            start = time.perf_counter()
            out[name]["losses"].append(step(i, x, y))
            if i >= warmup:
                out[name]["times"].append(time.perf_counter() - start)
    after = torchspmd.metrics()
    out["counters"] = {k: after[k] - marks.get(k, 0) for k in after}
    return out


def peak_bytes(memory) -> int | None:
    """Peak device bytes of one program run from XLA's memory analysis (arguments +
    outputs - donated aliases + temporaries), per device."""
    if memory is None:
        return None
    return (memory.argument_size_in_bytes + memory.output_size_in_bytes
            - memory.alias_size_in_bytes + memory.temp_size_in_bytes)
