"""Parameter and batch layouts of the training-step benchmark (``train_step.py --mesh``).

The layouts of ``examples/gpt.py``'s ``param_spec``, adapted to ``TinyTransformer``'s
names; ``Layout`` pairs a ``('data', 'model')`` mesh with one strategy.
"""

from __future__ import annotations

import torchspmd
from torchspmd.sharding.partition_spec import named_sharding

STRATEGIES = ("dp", "fsdp", "tp", "fsdp+tp")
AXES = ("data", "model")  # the batch axis and the tensor-parallel axis


# Megatron-LM: the first matmul of a pair splits its output features (column parallel),
# the second its input features (row parallel), so the pair needs one all-reduce.
_COLUMN = (".qkv", ".up")
_ROW = (".proj", ".down")


def param_spec(name: str, shape: tuple, strategy: str) -> tuple:
    """Partition spec of state_dict entry ``name`` (of ``shape``) on a ('data','model') mesh.

    >>> param_spec("blocks.0.qkv.weight", (384, 128), "fsdp+tp")
    ('model', 'data')
    >>> param_spec("blocks.0.down.weight", (128, 512), "tp")
    (None, 'model')
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {STRATEGIES}")
    spec: list = [None] * len(shape)
    if "tp" in strategy and name.startswith("blocks."):
        module = name.rsplit(".", 1)[0]
        if module.endswith(_COLUMN):
            spec[0] = "model"  # weight rows = output features; the bias follows them
        elif module.endswith(_ROW) and name.endswith(".weight"):
            spec[1] = "model"  # weight columns = input features; the bias stays replicated
    if strategy in ("fsdp", "fsdp+tp"):
        # FSDPv2: the largest dim that is still unsplit, over every device (fsdp) or
        # over 'data' (fsdp+tp).
        free = [d for d in range(len(shape)) if spec[d] is None]
        if free:
            largest = max(free, key=lambda d: (shape[d], -d))
            spec[largest] = AXES if strategy == "fsdp" else "data"
    return tuple(spec)


def batch_spec(strategy: str) -> tuple:
    """Over every device unless 'model' holds TP shards (then over 'data')."""
    return ("data", None) if "tp" in strategy else (AXES, None)


class Layout:
    """A mesh and a strategy: the partition spec of every parameter and of the batch."""

    def __init__(self, shape: tuple[int, int], strategy: str):
        self.strategy = strategy
        self.mesh = torchspmd.Mesh(range(shape[0] * shape[1]), shape, AXES)
        self.batch = batch_spec(strategy)

    def spec(self, name: str, shape) -> tuple:
        return param_spec(name, tuple(shape), self.strategy)

    def jax_sharding(self, name: str, shape):
        return named_sharding(self.mesh, self.spec(name, shape))
