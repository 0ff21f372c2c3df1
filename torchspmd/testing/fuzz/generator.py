"""Random fuzz programs: meshes, tensors, op chains and sharding calls, as Python source.

Each line is run on CPU as it is written, so the generator knows every tensor's shape,
dtype and values, and drops a line CPU rejects (a bad broadcast, a write through an
expanded view). Everything is drawn from one ``random.Random(seed)``: the same seed
gives the same program. Example::

    >>> program = generate(seed=3, index=0)
    >>> print(program.source)          # def program(dev, xs): ...
"""

from __future__ import annotations

import math
import random
import re
import textwrap
from dataclasses import dataclass

import torch

from torchspmd.testing.fuzz import flow, ops
from torchspmd.testing.fuzz.calls import CpuCalls, data
from torchspmd.testing.fuzz.training import training_program

N_DEVICES = 8
DTYPES = (torch.float32, torch.int64, torch.bfloat16)
SIZES = (1, 2, 3, 4, 5, 6, 8)


@dataclass
class Program:
    """One generated program: the source of ``def program(dev, xs)`` and how it was drawn."""

    seed: int
    index: int
    source: str
    mixes_device_sets: bool


@dataclass
class MeshInfo:
    name: str
    ids: list[int]
    shape: tuple[int, ...]
    names: tuple[str, ...] | None


def _factor(n: int, dims: int, rng: random.Random) -> tuple[int, ...]:
    """``n`` split into ``dims`` factors (size-1 factors allowed), in random order."""
    shape = [1] * dims
    rest = n
    for p in (2, 3, 5, 7):
        while rest % p == 0:
            shape[rng.randrange(dims)] *= p
            rest //= p
    return tuple(shape)


def _mesh(name: str, ids: list[int], rng: random.Random) -> MeshInfo:
    dims = rng.choice((1, 1, 2, 2, 3))
    shape = _factor(len(ids), dims, rng)
    names = rng.choice((None, ("a", "b", "c")[:dims], ("data", "model", "x")[:dims]))
    return MeshInfo(name, ids, shape, names)


def _device_ids(rng: random.Random, everything: bool) -> list[int]:
    count = N_DEVICES if everything else rng.choice((1, 2, 2, 3, 4, 4, 6))
    ids = rng.sample(range(N_DEVICES), count) if rng.random() < 0.5 else \
        sorted(rng.sample(range(N_DEVICES), count))
    if count < N_DEVICES and rng.random() < 0.3:
        ids = list(range(count))  # the common sub-mesh [0..k)
    return ids


MAX_ELEMENTS = 4096  # programs keep every tensor small: fast, and exact to compare


# A line with one of these computes with rounding: its result, even where CPU's value is a
# whole number, may differ from the device's in the last bit (CPU's bfloat16 log_softmax
# gives 0.0 where the float-accumulated value is -0.0025), so it must not feed an op that
# turns the last bit into a whole unit (floor division, %, comparisons, argmax).
ROUNDING = ("softmax", "exp(", "tanh(", "sin(", "sigmoid(", "sqrt(", "/ 3", "mean(",
            "logsumexp(", "var(", "prod(", "@", "matmul", "norm", "conv", "bmm", "einsum")
_NAME = re.compile(r"\bt\d+\b")


class LineSkipped(Exception):
    """A drawn op that cannot be written with small tensors; the generator draws on."""


class Builder:
    """Writes a program line by line, running each line on CPU to keep its state."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.lines: list[str] = []
        self.env: dict = self._fresh_env()
        self.count = 0
        self.meshes: list[MeshInfo] = []
        self.marked: set[str] = set()
        # Names whose values may carry rounding (see ROUNDING), and per name the names
        # its line read (a view changes with its base: marking a base marks them too).
        self.rounded: set[str] = set()
        self.made_from: dict[str, set[str]] = {}

    # -- state -------------------------------------------------------------------------

    @staticmethod
    def _fresh_env() -> dict:
        return {"torch": torch, "data": data, "dev": "cpu", "xs": CpuCalls}

    def rebuild(self) -> None:
        """Run the kept lines again from a fresh namespace: the state they leave.

        Restoring a copy of the namespace is not enough after in-place ops (``t.t_()``,
        ``t.add_(1)``) changed the tensor objects themselves.
        """
        self.env = self._fresh_env()
        for line in self.lines:
            exec(line, self.env)

    def tensors(self) -> list[str]:
        return [n for n, v in self.env.items() if n.startswith("t") and isinstance(v, torch.Tensor)]

    def value(self, name: str) -> torch.Tensor:
        return self.env[name]

    def new_name(self) -> str:
        """The name the next new tensor gets (taken once a line defining it is kept)."""
        return f"t{self.count}"

    def assign(self, expr: str) -> bool:
        """Emit ``<new name> = expr``."""
        return self.emit(f"{self.new_name()} = {expr}")

    def emit(self, line: str) -> bool:
        """Run ``line`` on CPU; keep it if CPU accepts it (and its results are small)."""
        try:
            exec(line, self.env)
            kept = not any(isinstance(v, torch.Tensor) and v.numel() > MAX_ELEMENTS
                           for v in self.env.values())
        except Exception:
            kept = False
        if not kept:
            self.rebuild()  # the line may have changed tensors in place before it failed
            return False
        self.lines.append(line)
        self._note_rounding(line)
        if self.new_name() in self.env:
            self.count += 1
        return True

    def _note_rounding(self, line: str) -> None:
        """Mark the name a kept line defines or changes in place (its first name) as
        rounded if the line rounds or reads a rounded name; and every name made from it."""
        names = _NAME.findall(line)
        if not names:
            return
        target, read = names[0], set(names[1:])
        self.made_from.setdefault(target, set()).update(read)
        if not (any(marker in line for marker in ROUNDING) or (set(names) & self.rounded)):
            return
        todo = [target]
        while todo:
            name = todo.pop()
            if name not in self.rounded:
                self.rounded.add(name)
                todo += [n for n, sources in self.made_from.items() if name in sources]

    def exact(self, name: str) -> bool:
        """Whether tensor ``name`` holds no rounding: made without any (see ROUNDING) and
        whole-valued (``ops.exact``)."""
        return name not in self.rounded and ops.exact(self.value(name))

    # -- what a line needs ---------------------------------------------------------------

    def pick(self, where=lambda v: True) -> str | None:
        names = [n for n in self.tensors() if where(self.value(n))]
        return self.rng.choice(names) if names else None

    def fresh(self, shape: tuple[int, ...] | None = None, dtype: torch.dtype | None = None) -> str:
        """Emit a new tensor (host data moved to the device, or a device factory)."""
        rng = self.rng
        if shape is None:
            shape = tuple(rng.choice(SIZES) for _ in range(rng.choice((1, 2, 2, 3))))
        if math.prod(shape) > MAX_ELEMENTS:  # a partner for a tensor a view made large
            raise LineSkipped(f"a fresh tensor of shape {shape} would be too large")
        dtype = dtype or rng.choice(DTYPES)
        name = self.new_name()
        dt = str(dtype)
        if rng.random() < 0.75:
            line = f"{name} = data({shape}, {dt}, {rng.randrange(10**6)}).to(dev)"
        else:
            n = math.prod(shape)
            line = f"{name} = (torch.arange({n}, dtype={dt}, device=dev) - {n // 2}).reshape({shape})"
        if not self.emit(line):
            raise RuntimeError(f"fuzz generator: CPU rejects its own tensor {line!r}")
        return name

    def spec(self, mesh: MeshInfo, rank: int) -> tuple:
        """A random partition spec for a rank-``rank`` tensor over ``mesh``."""
        rng = self.rng
        free = list(range(len(mesh.shape)))
        rng.shuffle(free)
        entries: list = []
        for _ in range(rank):
            choice = rng.random()
            if choice < 0.35 or not free:
                entries.append(None)
                continue
            take = 2 if choice > 0.85 and len(free) >= 2 else 1
            axes = [free.pop() for _ in range(take)]
            named = [mesh.names[a] if mesh.names and rng.random() < 0.6 else a for a in axes]
            entries.append(tuple(named) if take > 1 or rng.random() < 0.15 else named[0])
        return tuple(entries)

    # -- sharding calls ------------------------------------------------------------------

    def sharding_call(self) -> None:
        rng = self.rng
        choice = rng.random()
        if choice < 0.2:
            self.emit("xs.sync()")
            return
        name = self.pick()
        if name is None:
            return
        if choice < 0.35:
            if self.emit(f"xs.clear_sharding({name})"):
                self.marked.discard(name)
            return
        mesh = rng.choice(self.meshes)
        spec = self.spec(mesh, self.value(name).dim())
        # mark_sharding of already sharded data must be cleared first: mostly avoid that.
        call = "annotate_custom_sharding" if choice < 0.55 or (
            name in self.marked and rng.random() < 0.9) else "mark_sharding"
        if self.emit(f"xs.{call}({name}, {mesh.name}, {spec!r})") and call == "mark_sharding":
            self.marked.add(name)


# How often a program trains a model rather than chaining ops.
TRAINING_SHARE = 0.2


def _draw_line(b: Builder, rng: random.Random, in_loop: bool = False) -> None:
    """One drawn line of an op program: an op, a sharding call, or what users do around
    them (a read, a manual region, a loop, a checkpoint, an error followed by more work)."""
    choice = rng.random()
    if choice < 0.25:
        b.sharding_call()
    elif choice < 0.32:
        flow.read(b)
    elif choice < 0.37:
        flow.manual(b)
    elif choice < 0.41 and not in_loop:
        flow.loop(b, lambda: _draw_line(b, rng, in_loop=True))
    elif choice < 0.43 and not in_loop:
        flow.checkpoint(b)
    elif choice < 0.445:
        flow.attempt(b)
    elif choice < 0.455 and not in_loop:
        flow.out_of_memory(b)
    else:
        try:
            ops.random_op(b)
        except LineSkipped:
            pass  # the lines it emitted before stand; the program goes on


def generate(seed: int, index: int) -> Program:
    """The ``index``-th program of the run seeded ``seed`` (a pure function of both)."""
    rng = random.Random(seed * 1_000_003 + index)
    b = Builder(rng)
    first = _mesh("m0", _device_ids(rng, everything=rng.random() < 0.45), rng)
    b.meshes.append(first)
    mixes = False
    if rng.random() < 0.35:
        if rng.random() < 0.7:  # the same devices in another order or shape: must mix freely
            ids = list(first.ids)
            rng.shuffle(ids)
        else:
            ids = _device_ids(rng, everything=rng.random() < 0.5)
            mixes = sorted(ids) != sorted(first.ids)
        b.meshes.append(_mesh("m1", ids, rng))
    for m in b.meshes:
        b.emit(f"{m.name} = xs.Mesh({m.ids}, {m.shape}, {m.names!r})")
    if rng.random() < TRAINING_SHARE:
        training_program(b, rng)
    else:
        for _ in range(rng.randint(1, 3)):
            b.fresh()
        for _ in range(rng.randint(5, 18)):
            _draw_line(b, rng)
    names = b.tensors()
    body = textwrap.indent("\n".join(b.lines), "    ")
    result = ", ".join(f"{n!r}: {n}" for n in names)
    source = f"def program(dev, xs):\n{body}\n    return {{{result}}}\n"
    return Program(seed, index, source, mixes)
