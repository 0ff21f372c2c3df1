"""``torch_xla.debug.profiler`` (``xp``): JAX's profiler, which records the XLA programs.

``start_server``, ``start_trace``/``stop_trace``, ``Trace``, ``StepTrace`` and ``trace_me``
are ``jax.profiler``'s (view the trace with TensorBoard or Perfetto, as PyTorch/XLA's).
``trace`` and ``trace_detached`` capture from a server at an address: start a trace in
the process instead.

Example (after ``torchspmd.compat.install()``)::

    import torch_xla.debug.profiler as xp
    xp.start_trace("/tmp/trace")
    with xp.StepTrace("train", step_num=0):
        loss = step(x, y)
    xp.stop_trace()
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax


def start_server(port: int, only_on_master: bool = True) -> Any:
    """``jax.profiler.start_server(port)``: a profiler server TensorBoard can capture from."""
    return jax.profiler.start_server(port)


# The rest take PyTorch/XLA's arguments as JAX's do: ``start_trace(log_dir)``,
# ``Trace(name, **kwargs)``, ``StepTrace(name, step_num=i)``.
stop_server = jax.profiler.stop_server
start_trace = jax.profiler.start_trace
stop_trace = jax.profiler.stop_trace
Trace = jax.profiler.TraceAnnotation
StepTrace = jax.profiler.StepTraceAnnotation


def trace_me(name: str) -> Callable[[Callable], Callable]:
    """A decorator: each call of the function is a :class:`Trace` span named ``name``
    (``jax.profiler.annotate_function``)."""
    return functools.partial(jax.profiler.annotate_function, name=name)


def trace(service_addr: str, logdir: str, *args: Any, **kwargs: Any) -> None:
    """Raises: capturing from a server at an address is not offered (see the module)."""
    raise NotImplementedError(_remote("xp.trace"))


def trace_detached(service_addr: str, logdir: str, *args: Any, **kwargs: Any) -> None:
    """Raises: capturing from a server at an address is not offered (see the module)."""
    raise NotImplementedError(_remote("xp.trace_detached"))


def _remote(call: str) -> str:
    return (f"torchspmd.compat: {call} captures from a profiler server at an address, which "
            "torchspmd does not offer; record in the process with xp.start_trace(log_dir) ... "
            "xp.stop_trace(), or capture from TensorBoard's profile tab after "
            "xp.start_server(port).")
