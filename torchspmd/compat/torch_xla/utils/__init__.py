"""``torch_xla.utils``."""

from . import checkpoint, utils  # noqa: F401
