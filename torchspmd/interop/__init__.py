"""Interoperation with JAX: JAX functions as nodes of the lazy graph.

Example::

    out = torchspmd.interop.call_jax(jax.nn.relu, x)   # also torchspmd.call_jax
"""

from torchspmd.interop.call_jax import call_jax

__all__ = ["call_jax"]
