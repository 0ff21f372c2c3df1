"""``torch_xla.debug``."""

from . import metrics, profiler  # noqa: F401
