"""``torch_xla.debug.metrics`` (``met``): torchspmd's counters under PyTorch/XLA's names.

``counter_value('UncachedCompile')`` is ``torchspmd.metrics()['graphs_compiled']``, and
``'CachedCompile'`` its cache hits; torchspmd's own names work too. PyTorch/XLA's timing
metrics (``metric_data``) have no equivalent: ``torchspmd.metrics()`` keeps totals only.
"""

from __future__ import annotations

import torchspmd
from torchspmd.compat.errors import refusing

# PyTorch/XLA counter name -> torchspmd.metrics() key with the same meaning.
COUNTER_NAMES = {
    "UncachedCompile": "graphs_compiled",
    "CachedCompile": "cache_hits",
    "ExecuteReplicated": "executions",
}


def counter_names() -> list[str]:
    """PyTorch/XLA's counter names served here, then torchspmd's own."""
    return [*COUNTER_NAMES, *torchspmd.metrics()]


def counter_value(name: str) -> float | None:
    """The counter's value; ``None`` for a name it does not know (as PyTorch/XLA)."""
    counters = torchspmd.metrics()
    return counters.get(COUNTER_NAMES.get(name, name))


def metrics_report() -> str:
    """Every counter, one per line."""
    return "".join(f"Counter: {name}\n  Value: {value}\n"
                   for name, value in torchspmd.metrics().items())


short_metrics_report = metrics_report


def executed_fallback_ops() -> list[str]:
    """``[]``: no op falls back to the CPU here (an op not lowered raises instead)."""
    return []


def clear_counters() -> None:
    """Zero every counter (``torchspmd.reset_metrics``)."""
    torchspmd.reset_metrics()


clear_all = clear_counters

metric_names = refusing("met.metric_names", "torchspmd.metrics() has totals such as "
                        "compile_time_s and trace_time_s")
metric_data = refusing("met.metric_data", "torchspmd.metrics() has totals such as "
                       "compile_time_s and trace_time_s")
clear_metrics = refusing("met.clear_metrics", "use met.clear_counters()")
