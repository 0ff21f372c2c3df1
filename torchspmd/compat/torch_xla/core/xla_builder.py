"""``torch_xla.core.xla_builder``: of PyTorch/XLA's HLO builder, the one call users' scripts
make, ``call_jax``; the builder itself (``Op``, ``create_computation``...) raises, naming
``torchspmd.call_jax``."""

from __future__ import annotations

from typing import Any, Callable

from torchspmd.interop import call_jax as _call_jax


def call_jax(jax_func: Callable, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None,
             name: str | None = None, override_hash: Any = None) -> Any:
    """``torchspmd.call_jax(jax_func, *args, **kwargs)``; gradients flow through it.

    ``name`` and ``override_hash`` only named and keyed PyTorch/XLA's cache of traced
    functions; torchspmd keys its cache by the function and the arguments' shapes.

    Example::

        >>> b = call_jax(lambda a, b: a + jnp.sin(b), (a, a))
    """
    return _call_jax(jax_func, *args, **(kwargs or {}))


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise NotImplementedError(f"torchspmd.compat: torch_xla.core.xla_builder.{name}: "
                              "PyTorch/XLA's HLO builder does not exist here; write the "
                              "computation in JAX and call it with torchspmd.call_jax.")
