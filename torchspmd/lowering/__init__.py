"""aten -> JAX lowerings: importing this package fills ``registry.LOWERINGS``."""

from torchspmd.lowering import (  # noqa: F401  (each module fills the table at import)
    activations, annotation_ops, attention, barrier, bessel, binary, conv, ctc, distances,
    embedding_bag, factorizations, factory, fft, foreach, indexing, ldl, linalg, logaddexp,
    nn, normalization, order_statistics, orthogonal_polynomials, padding, pool3d, random,
    reductions, shape, sized, solvers, special, unary, upsample, zeta)
from torchspmd.lowering import (fractional_pool, fused_optimizers, grid_sample,  # noqa: F401
                                grouped_mm, histograms, margin_losses, rnn_cells, segments)
from torchspmd.lowering.registry import LOWERINGS, RANDOM_OPS, lowers

__all__ = ["LOWERINGS", "RANDOM_OPS", "lowers"]
