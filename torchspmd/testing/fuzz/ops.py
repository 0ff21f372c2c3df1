"""The op families a fuzz program draws from: each writes one or two lines into a Builder.

Families: elementwise ops (with broadcasting and casts), views, in-place writes (through
views too), reductions, matmuls, indexing (advanced indices, gather, index_select,
index_put_), cat/stack, softmax, and grouped convolutions with their gradients. A family that needs a partner tensor of some shape
makes one. Ops whose result is discrete (argmax, comparisons, casts to int) are applied
only to values with no rounding in them, so CPU and XLA cannot legitimately differ.
Example::

    >>> random_op(builder)    # e.g. emits "t4 = t2.transpose(0, 1)"
"""

from __future__ import annotations

import math

import torch

# Integers up to these are exact in each float dtype (and so in every op over them).
_EXACT_LIMIT = {torch.float32: 2**24, torch.bfloat16: 256, torch.float64: 2**53}


def exact(v: torch.Tensor) -> bool:
    """Whether ``v`` holds no rounding: integers, or small integer-valued floats."""
    if not v.is_floating_point():
        return v.dtype != torch.bool
    limit = _EXACT_LIMIT.get(v.dtype, 0)
    return bool(v.isfinite().all() and (v == v.round()).all() and (v.abs() <= limit).all())


def small(v: torch.Tensor, bound: float = 20.0) -> bool:
    return bool(v.isfinite().all() and (v.abs() <= bound).all())


def _float(v: torch.Tensor) -> bool:
    return v.is_floating_point()


def _tensor_and_dim(b) -> tuple[str, torch.Tensor, int] | None:
    """A live tensor of at least one dim (its name and CPU value) and one of its dims."""
    x = b.pick(lambda v: v.dim() > 0)
    if x is None:
        return None
    v = b.value(x)
    return x, v, b.rng.randrange(v.dim())


def elementwise(b) -> None:
    rng = b.rng
    x = b.pick()
    if x is None:
        return
    v = b.value(x)
    unary = [f"{x} * 2", f"{x} + 1", f"-{x}", f"{x}.abs()", f"torch.relu({x})",
             f"{x}.clamp({rng.randint(-3, 0)}, {rng.randint(0, 3)})", f"{x} - {x}.flip(0)"]
    if _float(v) and small(v):
        unary += [f"{x}.exp()", f"{x}.tanh()", f"{x}.sin()", f"torch.sigmoid({x})",
                  f"{x}.abs().sqrt()", f"{x} / 3"]
    if b.exact(x):
        unary += [f"({x} > 0).to({v.dtype})", f"torch.where({x} > 1, {x}, -{x})",
                  f"{x}.to(torch.float32)", f"{x}.to(torch.int64)", f"{x}.to(torch.bfloat16)",
                  f"torch.div({x}, 3, rounding_mode='floor')", f"{x} % 3"]
    if rng.random() < 0.5:
        b.assign(rng.choice(unary))
        return
    # A binary op with a partner of the same or a broadcastable shape.
    shape = list(v.shape)
    if shape and rng.random() < 0.4:
        shape = shape[rng.randrange(len(shape)):] if rng.random() < 0.5 else \
            [1 if rng.random() < 0.5 else s for s in shape]
    y = b.pick(lambda w: list(w.shape) == shape and w.dtype == v.dtype) \
        if rng.random() < 0.5 else None
    y = y or b.fresh(tuple(shape), v.dtype)
    binary = [f"{x} + {y}", f"{x} * {y}", f"{x} - {y}", f"torch.maximum({x}, {y})",
              f"torch.minimum({x}, {y})", f"{y} + {x}"]
    if b.exact(x) and b.exact(y):
        binary += [f"torch.where({y} > 0, {x}, {y})"]
    b.assign(rng.choice(binary))


def view(b) -> None:
    rng = b.rng
    picked = _tensor_and_dim(b)
    if picked is None:
        return
    x, v, d = picked
    n = v.shape[d]
    lo = rng.randrange(n)
    hi = rng.randint(lo + 1, n)
    pre = ":, " * d
    choices = [f"{x}[{pre}{lo}:{hi}]", f"{x}[{pre}{lo}]", f"{x}[{pre}{lo}::{rng.randint(1, 3)}]",
               f"{x}.unsqueeze({rng.randint(0, v.dim())})", f"{x}.view(-1)", f"{x}.flatten()",
               f"{x}.narrow({d}, {lo}, {hi - lo})", f"{x}.select({d}, {-n + lo})",
               f"{x}[..., {rng.randrange(v.shape[-1])}]", f"{x}.squeeze()"]
    if v.dim() >= 2:
        e = rng.choice([i for i in range(v.dim()) if i != d])
        perm = list(range(v.dim()))
        rng.shuffle(perm)
        choices += [f"{x}.transpose({d}, {e})", f"{x}.permute{tuple(perm)}", f"{x}.diagonal()",
                    f"{x}.reshape({-1}, {v.shape[-1]})", f"{x}.mT"]
    if 1 in v.shape:
        choices.append(f"{x}.expand({', '.join(str(s if s != 1 else 3) for s in v.shape)})")
    b.assign(rng.choice(choices))


def in_place(b) -> None:
    rng = b.rng
    picked = _tensor_and_dim(b)
    if picked is None:
        return
    x, v, d = picked
    i = rng.randrange(-v.shape[d], v.shape[d])
    pre = ":, " * d
    scalar = rng.randint(-5, 5)
    choices = [f"{x}.add_(1)", f"{x}.mul_({scalar})", f"{x}[{pre}{i}] = {scalar}",
               f"{x}[{pre}{i}:] = {scalar}", f"{x}.zero_()", f"{x}.fill_({scalar})",
               f"{x}.clamp_({-abs(scalar)}, {abs(scalar)})", f"{x}.neg_()",
               f"{x}[{pre}{i}].add_({scalar})", f"{x}[{pre}::2].mul_(3)"]
    if v.dim() == 2:
        choices += [f"{x}.t_()", f"{x}.t().add_(1)"]
    if b.exact(x):
        choices += [f"{x}.masked_fill_({x} > 0, {scalar})"]
    line = rng.choice(choices)
    if rng.random() < 0.35:  # a tensor source, same shape or broadcast
        shape = tuple(v.shape[d + 1:]) if rng.random() < 0.5 else tuple(v.shape)
        y = b.pick(lambda w: tuple(w.shape) == shape and w.dtype == v.dtype) or \
            b.fresh(shape, v.dtype)
        line = rng.choice([f"{x}.add_({y})", f"{x}.copy_({y})", f"{x}.mul_({y})"])
        if shape == tuple(v.shape[d + 1:]):
            line = rng.choice([line, f"{x}[{pre}{i}] = {y}"])
    b.emit(line)


def reduction(b) -> None:
    rng = b.rng
    x = b.pick()
    if x is None:
        return
    v = b.value(x)
    d = rng.randrange(v.dim()) if v.dim() else 0
    keep = rng.random() < 0.3
    choices = [f"{x}.sum()", f"{x}.sum({d}, keepdim={keep})", f"{x}.amax({d})",
               f"{x}.amin({d}, keepdim={keep})", f"{x}.cumsum({d})", f"{x}.max({d}).values",
               f"{x}.sum(({d}, {-1}))" if v.dim() > 1 else f"{x}.sum(-1)"]
    if _float(v):
        choices += [f"{x}.mean({d})", f"{x}.mean()"]
        if small(v):
            choices.append(f"{x}.logsumexp({d})")
            if v.dim() and v.shape[d] > 1:  # var of one element is NaN, with a warning
                choices.append(f"{x}.var({d})")
    if b.exact(x) and v.numel() > 0:
        choices += [f"{x}.argmax({d})", f"{x}.argmin()", f"{x}.max({d}).indices"]
    if small(v, 4) and v.numel() <= 64:
        choices.append(f"{x}.prod({d})")
    b.assign(rng.choice(choices))


def matmul(b) -> None:
    rng = b.rng
    x = b.pick(lambda v: v.dim() in (1, 2, 3) and v.dtype != torch.bool)
    if x is None:
        return
    v = b.value(x)
    k = v.shape[-1]
    n = rng.choice((1, 2, 3, 4, 5))
    shape = (k,) if rng.random() < 0.2 else (k, n)
    if v.dim() == 3 and rng.random() < 0.5:
        shape = (v.shape[0], k, n)
    y = b.pick(lambda w: tuple(w.shape) == shape and w.dtype == v.dtype) or b.fresh(shape, v.dtype)
    b.assign(rng.choice([f"{x} @ {y}", f"torch.matmul({x}, {y})"]))


def indexing(b) -> None:
    rng = b.rng
    picked = _tensor_and_dim(b)
    if picked is None:
        return
    x, v, d = picked
    n = v.shape[d]
    idx = [rng.randrange(-n, n) for _ in range(rng.randint(1, 4))]
    pos = [i % n for i in idx]
    pre = ":, " * d
    index = f"torch.tensor({idx}, device=dev)"
    choices = [f"OUT = {x}[{pre}{index}]",
               f"OUT = {x}.index_select({d}, torch.tensor({pos}, device=dev))",
               f"{x}[{pre}{index}] = {rng.randint(-5, 5)}",
               f"{x}.index_fill_({d}, torch.tensor({pos}, device=dev), {rng.randint(-5, 5)})"]
    gather_shape = list(v.shape)
    gather_shape[d] = len(pos)
    gidx = torch.randint(0, n, gather_shape, generator=torch.Generator().manual_seed(rng.randrange(10**6)))
    choices.append(f"OUT = {x}.gather({d}, torch.tensor({gidx.tolist()}, device=dev))")
    if v.dim() == 1 and len(set(pos)) == len(pos):
        choices.append(f"{x}.index_put_((torch.tensor({pos}, device=dev),), "
                       f"torch.arange({len(pos)}, device=dev).to({v.dtype}))")
    line = rng.choice(choices)
    b.emit(line.replace("OUT", b.new_name(), 1) if line.startswith("OUT") else line)


def combine(b) -> None:
    """cat / stack / softmax."""
    rng = b.rng
    picked = _tensor_and_dim(b)
    if picked is None:
        return
    x, v, d = picked
    if _float(v) and small(v) and rng.random() < 0.4:
        fn = rng.choice(("torch.softmax", "torch.log_softmax"))
        b.assign(f"{fn}({x}, {d})")
        return
    shape = list(v.shape)
    if rng.random() < 0.5:
        shape[d] = rng.choice((1, 2, 3))
    y = b.pick(lambda w: list(w.shape) == shape and w.dtype == v.dtype) or b.fresh(tuple(shape), v.dtype)
    if list(v.shape) == shape and rng.random() < 0.3:
        b.assign(f"torch.stack([{x}, {y}], {d})")
    else:
        b.assign(f"torch.cat([{x}, {y}, {x}][:{rng.randint(2, 3)}], {d})")


def convolution(b) -> None:
    """A grouped (or depthwise) 1-, 2- or 3-d convolution with its input and weight
    gradients, its input marked with a random spec over its batch and channel dims."""
    rng = b.rng
    dims = rng.choice((1, 1, 2, 2, 3))
    groups = rng.choice((1, 2, 4))
    per_group = rng.choice((1, 1, 2))  # 1: depthwise when out channels == groups
    channels = groups * per_group
    out_channels = groups * rng.choice((1, 2))
    batch = rng.choice((2, 4, 8))
    spatial = tuple(rng.choice((3, 4, 5, 6) if dims < 3 else (3, 4)) for _ in range(dims))
    while batch > 2 and batch * channels * math.prod(spatial) > 1024:  # programs stay small
        batch //= 2
    kernel = tuple(rng.choice((1, 2, 3)) for _ in range(dims))
    x = b.fresh((batch, channels) + spatial, torch.float32)
    w = b.fresh((out_channels, per_group) + kernel, torch.float32)
    stride, padding, dilation = rng.choice((1, 2)), rng.choice((0, 1)), rng.choice((1, 1, 2))
    mesh = rng.choice(b.meshes)
    # Batch and channels only: XLA aborts the process on a strided convolution's gradient
    # with its spatial dims sharded (docs/limits.md; tests/lowering/test_xla_conv_bugs.py).
    spec = b.spec(mesh, 2) + (None,) * dims
    b.assign(f"xs.conv_grads({x}, {w}, {groups}, {stride}, {padding}, {dilation}, "
             f"{mesh.name}, {spec!r})")


FAMILIES = ((elementwise, 5), (view, 4), (in_place, 4), (reduction, 3), (matmul, 2),
            (indexing, 2), (combine, 2), (convolution, 1))


def random_op(b) -> None:
    """Emit one op of a random family into builder ``b``."""
    fn = b.rng.choices([f for f, _ in FAMILIES], weights=[w for _, w in FAMILIES])[0]
    fn(b)
