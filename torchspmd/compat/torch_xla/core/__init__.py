"""``torch_xla.core``."""

from . import xla_model  # noqa: F401
