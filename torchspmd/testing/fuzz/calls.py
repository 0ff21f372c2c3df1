"""What a fuzz program calls as ``xs``: the sharding API, and what a user does around ops.

A program runs twice, with the same source: on CPU eager with :class:`CpuCalls`, where
every call leaves values as they are, and on the spmd device with :class:`SpmdCalls`,
where each call does the real thing. Besides the sharding API, a program does what users'
programs do around their ops, each of which must leave every value as CPU has it:

- ``xs.read(t)``: a host read in the middle (runs all pending work);
- ``xs.manual(t, mesh, spec, fn)``: a manual-sharding region (``enable_manual_sharding``,
  an elementwise op on the local blocks, ``disable_manual_sharding``) whose local block
  the program keeps alive;
- ``xs.checkpoint({...})``: a sharded checkpoint saved, the tensors zeroed, and loaded back;
- ``xs.out_of_memory()``: a step that cannot fit, which must raise a clear
  ``OutOfMemoryError``; the failed tensor stays alive and must not spoil later work;
- ``xs.attempt(fn)``: an op that raises (on both sides), after which work goes on;
- ``xs.conv_grads(...)``: a (grouped) convolution with its input and weight gradients;
- ``xs.compile(fn)``: ``torchspmd.compile`` on the device;
- ``xs.settled(call)``: a compiled step called three times with nothing in between,
  whose third call must replay what is already captured (capturing on every call gives
  right values, so only this check sees it);
- ``xs.set_weight_decay(opt, v)``, ``xs.edit_state(opt)``, ``xs.edit_parameter(model)``: a
  hyperparameter, optimizer state or a parameter changed by hand between steps.

Example::

    >>> program("cpu", CpuCalls)              # CPU eager: the expected values
    >>> program(torchspmd.device(), SpmdCalls) # the spmd device: must give the same
"""

from __future__ import annotations

import tempfile
import traceback
import warnings

import torch
import torch.nn.functional as F

import torchspmd
from torchspmd.sharding import get_sharding
from torchspmd.testing.fuzz import oracle

# Elementwise ops a manual region applies to its local blocks: the same on any tiling.
LOCAL_OPS = {
    "double": lambda x: x * 2,
    "plus_one": lambda x: x + 1,
    "relu": torch.relu,
    "square": lambda x: x * x,
}

# More than any host's address space (128 TiB of float32): fails at once, never swaps.
_IMPOSSIBLE_ELEMENTS = 2**45


class WrongSharding(Exception):
    """An annotation's text differs from the oracle's (a wrong value of ``get_sharding``)."""


class WrongOutcome(Exception):
    """The device did something other than what the program's call requires."""


def data(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Small integer-valued CPU data of ``shape``: exact in every fuzzed dtype.

    >>> data((2, 3), torch.float32, 0).shape
    torch.Size([2, 3])
    """
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-4, 5, shape, generator=g).to(dtype)


def raised_in_jax(e: BaseException) -> bool:
    """Whether ``e`` came out of JAX or jaxlib (never the right error for a user)."""
    frames = traceback.extract_tb(e.__traceback__)
    return bool(frames) and ("/jax/" in frames[-1].filename or "/jaxlib/" in frames[-1].filename)


def _conv_grads(x: torch.Tensor, w: torch.Tensor, groups: int, stride: int, padding: int,
                dilation: int, mark=None) -> torch.Tensor:
    """A convolution's output, input gradient and weight gradient, flattened into one."""
    conv = (F.conv1d, F.conv2d, F.conv3d)[x.dim() - 3]
    x = x.detach().requires_grad_()
    w = w.detach().requires_grad_()
    if mark is not None:
        mark(x)
    out = conv(x, w, None, stride, padding, dilation, groups)
    # Integer weights on the output keep every gradient exact (no rounding to compare).
    g = (torch.arange(out.numel(), device=out.device) % 5 - 2).to(out.dtype).reshape(out.shape)
    (out * g).sum().backward()
    return torch.cat([out.detach().flatten(), x.grad.flatten(), w.grad.flatten()])


class CpuCalls:
    """The calls of a program on CPU eager: the values a correct device must give."""

    @staticmethod
    def Mesh(device_ids, mesh_shape, axis_names=None):  # noqa: N802 (torchspmd's name)
        return (tuple(device_ids), tuple(mesh_shape), axis_names)

    @staticmethod
    def mark_sharding(t, mesh, spec):
        return t

    annotate_custom_sharding = mark_sharding

    @staticmethod
    def clear_sharding(t):
        return t

    @staticmethod
    def sync():
        return None

    @staticmethod
    def read(t):
        return None

    @staticmethod
    def manual(t, mesh, spec, op: str):
        # A manual region hands back a new tensor, contiguous as any op of PyTorch/XLA's
        # (``disable_manual_sharding``); ``t + 1`` on the CPU would keep a transposed
        # input's strides, and ``flatten()`` of it copy where the device's is a view
        # (seed 45, program 142: a write through the result changed the flattened copy).
        return LOCAL_OPS[op](t).contiguous(), None

    @staticmethod
    def checkpoint(tensors: dict) -> None:
        return None

    @staticmethod
    def out_of_memory():
        return None

    @staticmethod
    def attempt(fn) -> None:
        try:
            fn()
        except Exception:
            pass

    @staticmethod
    def conv_grads(x, w, groups, stride, padding, dilation, mesh=None, spec=None):
        return _conv_grads(x, w, groups, stride, padding, dilation)

    @staticmethod
    def compile(fn):
        return fn

    @staticmethod
    def settled(call):
        """``call()`` three times; the last call's result."""
        call()
        call()
        return call()

    @staticmethod
    def set_weight_decay(opt: torch.optim.Optimizer, value: float) -> None:
        """A hyperparameter set by hand (a compiled step is captured again)."""
        for group in opt.param_groups:
            group["weight_decay"] = value

    @staticmethod
    def edit_state(opt: torch.optim.Optimizer) -> None:
        """Change the first parameter's optimizer state by hand: a counter +3, each other
        tensor halved (the same on both sides)."""
        with torch.no_grad():
            for state in list(opt.state.values())[:1]:
                for value in state.values():
                    if torch.is_tensor(value):
                        value.add_(3) if value.dim() == 0 else value.mul_(0.5)

    @staticmethod
    def edit_parameter(model: torch.nn.Module) -> None:
        """Halve the first parameter by hand."""
        with torch.no_grad():
            next(model.parameters()).mul_(0.5)


class SpmdCalls(CpuCalls):
    """The same calls on the spmd device; each annotation's text is checked too."""

    Mesh = torchspmd.Mesh
    clear_sharding = staticmethod(torchspmd.clear_sharding)
    sync = staticmethod(torchspmd.sync)
    compile = staticmethod(torchspmd.compile)

    @staticmethod
    def settled(call):
        # The first call may capture (state changed by hand in the loop), and so may the
        # second: a capture's outputs of state no one annotated come back laid out as
        # XLA's propagation chose, which the next call's inputs then are (``_placed``).
        call()
        call()
        captures = torchspmd.metrics()["step_captures"]
        result = call()
        if torchspmd.metrics()["step_captures"] != captures:
            raise WrongOutcome("a compiled step called three times with the same arguments "
                               "and nothing in between was captured again on the third call")
        return result

    @staticmethod
    def _checked(call, t, mesh, spec):
        result = call(t, mesh, spec)
        want = oracle.expected_sharding_text(mesh.device_ids.tolist(), mesh.mesh_shape,
                                             mesh.axis_names, tuple(spec))
        got = get_sharding(t)
        if got != want:
            raise WrongSharding(f"{call.__name__}(spec={tuple(spec)}) on mesh "
                                f"{mesh.device_ids.tolist()} {mesh.mesh_shape}: get_sharding "
                                f"gives {got!r}, expected {want!r}")
        return result

    @classmethod
    def mark_sharding(cls, t, mesh, spec):
        return cls._checked(torchspmd.mark_sharding, t, mesh, spec)

    @classmethod
    def annotate_custom_sharding(cls, t, mesh, spec):
        return cls._checked(torchspmd.annotate_custom_sharding, t, mesh, spec)

    @staticmethod
    def read(t):
        t.cpu()

    @staticmethod
    def manual(t, mesh, spec, op: str):
        local = torchspmd.enable_manual_sharding(t, spec, mesh=mesh).global_tensor
        local = LOCAL_OPS[op](local)
        full = torchspmd.disable_manual_sharding(local, spec, tuple(t.shape), mesh=mesh)
        return full.global_tensor, local  # the program keeps the local block alive

    @staticmethod
    def checkpoint(tensors: dict) -> None:
        import torch.distributed.checkpoint as dcp

        from torchspmd.checkpoint import SPMDLoadPlanner, SPMDSavePlanner

        with tempfile.TemporaryDirectory() as path, warnings.catch_warnings():
            warnings.filterwarnings("ignore", "torch.distributed is disabled")
            dcp.save(dict(tensors), checkpoint_id=path, planner=SPMDSavePlanner())
            for t in tensors.values():
                t.zero_()
            dcp.load(dict(tensors), checkpoint_id=path, planner=SPMDLoadPlanner())

    @staticmethod
    def out_of_memory():
        big = torch.ones(_IMPOSSIBLE_ELEMENTS, device=torchspmd.device()) * 2
        try:
            # sync(), not a read of a few elements: a read needs only what it reads, which
            # XLA may compute without the whole tensor when other work cannot run with it.
            torchspmd.sync()
        except torch.OutOfMemoryError:
            return big  # kept alive by the program: its failed work must not spread
        raise WrongOutcome(f"a step with a {_IMPOSSIBLE_ELEMENTS}-element tensor did not raise "
                           "OutOfMemoryError")

    @staticmethod
    def attempt(fn) -> None:
        try:
            fn()
        except (AssertionError, KeyError, AttributeError):
            raise  # an internal error, for the runner to report
        except Exception as e:
            if raised_in_jax(e):
                raise
            return
        raise WrongOutcome("an op that CPU rejects was accepted on the device")

    @staticmethod
    def conv_grads(x, w, groups, stride, padding, dilation, mesh=None, spec=None):
        mark = None if mesh is None else (lambda leaf: torchspmd.mark_sharding(leaf, mesh, spec))
        return _conv_grads(x, w, groups, stride, padding, dilation, mark)
