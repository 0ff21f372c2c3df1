"""What a user's program does around its ops, drawn into a fuzz program.

Each function writes a few lines into a :class:`~torchspmd.testing.fuzz.generator.Builder`:
host reads in the middle, loops whose body runs again with values kept alive from the
step before (``sync()`` and reads inside), manual-sharding regions whose local blocks stay
referenced, a checkpoint saved and loaded back, a step that runs out of memory, and an op
that raises, each followed by more work. The calls themselves are in ``calls.py``.
Example::

    >>> loop(builder, body=lambda: random_op(builder))   # "for step in range(2): ..."
"""

from __future__ import annotations

import math

import torch

from torchspmd.testing.fuzz.calls import LOCAL_OPS


def read(b) -> None:
    """A host read of one live tensor, in the middle of the program."""
    name = b.pick()
    if name is not None:
        b.emit(f"xs.read({name})")


def _divisible_spec(b, mesh, shape: tuple[int, ...]) -> tuple | None:
    """A spec over ``mesh`` whose mesh axes divide the dims they shard, or None."""
    for _ in range(6):
        spec = b.spec(mesh, len(shape))
        sizes = []
        for entry in spec:
            axes = entry if isinstance(entry, tuple) else (() if entry is None else (entry,))
            sizes.append(math.prod(mesh.shape[a if isinstance(a, int) else mesh.names.index(a)]
                                   for a in axes))
        if all(d % s == 0 for d, s in zip(shape, sizes)) and any(s > 1 for s in sizes):
            return spec
    return None


def manual(b) -> None:
    """A manual region: local blocks, an elementwise op on them, the blocks reassembled.

    The local block is bound to an ``l``-name, so it stays alive at the next ``sync()``
    as a user's variable would (it is never compared: its value is per device).
    """
    name = b.pick(lambda v: v.dim() > 0 and v.dtype != torch.bool)
    if name is None:
        return
    mesh = b.rng.choice(b.meshes)
    spec = _divisible_spec(b, mesh, tuple(b.value(name).shape))
    if spec is None:
        return
    op = b.rng.choice(sorted(LOCAL_OPS))
    out = b.new_name()
    if b.emit(f"{out}, l{out[1:]} = xs.manual({name}, {mesh.name}, {spec!r}, {op!r})"):
        b.marked.add(name)


def checkpoint(b) -> None:
    """Save some tensors, zero them, load them back: the values must be as before."""
    # Views share storage with their base (zeroing one zeroes the other) and expanded
    # views cannot be written: only tensors that own their storage are saved.
    names = [n for n in b.tensors() if b.value(n)._base is None and b.value(n).dim() > 0]
    if not names:
        return
    chosen = b.rng.sample(names, min(len(names), b.rng.randint(1, 3)))
    b.emit("xs.checkpoint({" + ", ".join(f"{n!r}: {n}" for n in chosen) + "})")


def out_of_memory(b) -> None:
    """A step that cannot fit: a clear error, and its failed tensor kept alive after it."""
    b.emit(f"oom{b.count} = xs.out_of_memory()")


def attempt(b) -> None:
    """An op that raises (a shape mismatch), caught by the program; work goes on."""
    name = b.pick(lambda v: v.dtype != torch.bool)
    if name is None:
        return
    n = b.value(name).numel()
    b.emit(f"xs.attempt(lambda: {name}.reshape(-1) @ torch.ones({n + 1}, dtype={name}.dtype, "
           f"device=dev))")


def loop(b, body) -> None:
    """``for step in range(k):`` around a few drawn lines, with ``sync()`` or a read inside.

    The body is drawn once on CPU (each line checked as usual), then the whole loop is run
    on CPU from the state before it (rebuilt by running the lines before it again); a loop CPU rejects on a later step (a line that
    changes a shape the next step relies on) is dropped.
    """
    lines, count, marked = list(b.lines), b.count, set(b.marked)
    for _ in range(b.rng.randint(2, 5)):
        body()
    if b.rng.random() < 0.7:
        b.emit("xs.sync()" if b.rng.random() < 0.5 else f"xs.read({b.pick() or 't0'})")
    drawn, after = b.lines[len(lines):], b.count
    b.lines[:] = lines
    b.rebuild()  # the drawing ran the body once, in place too
    b.marked = marked | b.marked
    if not drawn:
        return
    steps = b.rng.randint(2, 3)
    block = f"for step in range({steps}):\n" + "\n".join("    " + line for line in drawn)
    if b.emit(block):
        b.count = after
    else:
        b.count = count
