"""aten -> JAX lowerings: importing this package fills ``registry.LOWERINGS``."""

from torchspmd.lowering import (activations, annotations, conv, elementwise,  # noqa: F401
                                factory, foreach, indexing, linalg, nn, normalization,
                                random, reductions, shape)
from torchspmd.lowering import (distances, embedding_bag, fractional_pool,  # noqa: F401
                                histograms, margin_losses, order_statistics, pool3d,
                                segments, sized, upsample)
from torchspmd.lowering.registry import LOWERINGS, RANDOM_OPS, lowers

__all__ = ["LOWERINGS", "RANDOM_OPS", "lowers"]
