"""aten -> JAX lowerings: importing this package fills ``registry.LOWERINGS``."""

import importlib

from torchspmd.lowering.registry import LOWERINGS, RANDOM_OPS, lowers

# One module per op family; each registers its lowerings on import.
_FAMILIES = ("elementwise", "reductions", "foreach", "shape", "indexing", "factory", "random",
             "linalg", "nn", "conv", "annotations")

for _family in _FAMILIES:
    try:
        importlib.import_module(f"torchspmd.lowering.{_family}")
    except ModuleNotFoundError as e:  # a family not written yet
        if e.name != f"torchspmd.lowering.{_family}":
            raise

__all__ = ["LOWERINGS", "RANDOM_OPS", "lowers"]
