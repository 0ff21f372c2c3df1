"""``torch_xla.utils``."""

from . import utils  # noqa: F401
