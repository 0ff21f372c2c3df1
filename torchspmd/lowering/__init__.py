"""aten -> JAX lowerings: importing this package fills ``registry.LOWERINGS``."""

from torchspmd.lowering import (activations, annotations, barrier, bessel,  # noqa: F401
                                binary, conv, distances, embedding_bag, factorizations,
                                factory, fft, foreach, indexing, ldl, linalg, logaddexp, nn,
                                normalization, order_statistics, orthogonal_polynomials, pool3d,
                                random, reductions, shape, sized, solvers, special, unary,
                                upsample, zeta)
from torchspmd.lowering import (fractional_pool, grouped_mm, histograms,  # noqa: F401
                                margin_losses, segments)
from torchspmd.lowering.registry import LOWERINGS, RANDOM_OPS, lowers

__all__ = ["LOWERINGS", "RANDOM_OPS", "lowers"]
