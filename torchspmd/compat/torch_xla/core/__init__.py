"""``torch_xla.core``."""

from . import xla_builder, xla_model  # noqa: F401
