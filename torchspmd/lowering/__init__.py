"""aten -> JAX lowerings: importing this package fills ``registry.LOWERINGS``."""

from torchspmd.lowering import (activations, annotations, barrier, conv,  # noqa: F401
                                elementwise, factory, foreach, indexing, linalg, nn,
                                normalization, random, reductions, shape)
from torchspmd.lowering.registry import LOWERINGS, RANDOM_OPS, lowers

__all__ = ["LOWERINGS", "RANDOM_OPS", "lowers"]
