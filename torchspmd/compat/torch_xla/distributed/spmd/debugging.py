"""``torch_xla.distributed.spmd.debugging``: pictures of a layout."""

from torchspmd.debug import visualize_sharding, visualize_tensor_sharding  # noqa: F401
