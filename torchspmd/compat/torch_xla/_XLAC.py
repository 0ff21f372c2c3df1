"""``torch_xla._XLAC``: PyTorch/XLA's C++ bindings. The few that users' scripts call to look at
a tensor (its sharding, its pending HLO, debug info, the metrics report) map onto the
public API; the others raise, naming what to use instead."""

from __future__ import annotations

from torchspmd.compat.errors import unsupported


def _xla_metrics_report() -> str:
    """``torch_xla.debug.metrics.metrics_report()``."""
    from .debug.metrics import metrics_report

    return metrics_report()


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    unsupported(f"torch_xla._XLAC.{name}", "torch_xla's C++ bindings do not exist here; use "
                "torchspmd.debug (pending_hlo, tensor_debug_info, metrics_report)")


def _get_xla_tensors_hlo(tensors) -> str:
    """``torchspmd.debug.pending_hlo``."""
    from torchspmd.debug import pending_hlo

    return pending_hlo(tensors)


def _get_xla_tensor_debug_info(tensor) -> str:
    """``torchspmd.debug.tensor_debug_info``."""
    from torchspmd.debug import tensor_debug_info

    return tensor_debug_info(tensor)


def _get_xla_sharding_spec(tensor) -> str:
    """The tensor's sharding as HLO text, ``""`` if it has none (``xs.get_sharding``)."""
    from torchspmd.sharding import get_sharding

    return get_sharding(tensor)
