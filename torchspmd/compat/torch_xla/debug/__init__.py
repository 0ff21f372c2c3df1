"""``torch_xla.debug``."""

from . import metrics  # noqa: F401
