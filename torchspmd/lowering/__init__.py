"""aten -> JAX lowerings: importing this package fills ``registry.LOWERINGS``."""

from torchspmd.lowering import (activations, annotations, bessel, conv,  # noqa: F401
                                elementwise, factory, fft, foreach, indexing, linalg,
                                logaddexp, nn, normalization, orthogonal_polynomials,
                                random, reductions, shape, special, zeta)
from torchspmd.lowering.registry import LOWERINGS, RANDOM_OPS, lowers

__all__ = ["LOWERINGS", "RANDOM_OPS", "lowers"]
