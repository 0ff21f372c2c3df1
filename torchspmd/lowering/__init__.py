"""aten -> JAX lowerings: importing this package fills ``registry.LOWERINGS``."""

from torchspmd.lowering import (annotations, conv, elementwise, factory, foreach,  # noqa: F401
                                indexing, linalg, nn, random, reductions, shape)
from torchspmd.lowering.registry import LOWERINGS, RANDOM_OPS, lowers

__all__ = ["LOWERINGS", "RANDOM_OPS", "lowers"]
