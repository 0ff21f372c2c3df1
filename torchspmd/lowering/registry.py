"""The aten overload -> JAX function table.

A lowering is a pure function of JAX values. It is called while ``jax.jit`` traces a
graph, never on the hot path of recording, so clarity beats speed here.

Calling convention, for ``@lowers(torch.ops.aten.add.Tensor)``::

    def add(meta, self, other, *, alpha=1): ...

- ``meta`` describes the result the recorder inferred with PyTorch's meta kernels:
  a ``jax.ShapeDtypeStruct`` (``.shape``, ``.dtype``), or a tuple of them when the op
  returns several tensors (``None`` for outputs that are not tensors).
- The remaining arguments mirror the aten schema, as PyTorch passed them: tensors are
  ``jax.Array``s, ``Tensor[]`` is a list of them, optional tensors may be ``None``.
- ``Scalar`` arguments (``alpha``, ``add.Scalar``'s ``other``, ``fill_value``...) may be
  Python numbers *or* 0-d JAX arrays (graph inputs, so a changing learning rate does not
  recompile): use them as values, never in Python control flow. Sizes, dims and other
  non-Scalar arguments (``int``, ``int[]``, ``bool``, ``float`` like ``eps``) are static
  Python values; a static ``float`` arrives as a ``StaticFloat``, which equals no plain
  number (``StaticFloat(0.0) != 0``: cache keys tell ``1.0`` from ``1``), so compare
  ``float(eps)``.
- Return one ``jax.Array`` (or a tuple/list for multi-output ops) with exactly
  ``meta``'s shape and dtype; compute in ``meta.dtype`` (cast inputs explicitly, as
  JAX's promotion differs from PyTorch's).
- Random ops receive an extra keyword ``key``: a JAX PRNG key (``jax.random.key``),
  a graph input so masks change each step without recompiling.
"""

from collections.abc import Callable

from torch._ops import OpOverload

Lowering = Callable[..., object]

# The one lowering table (a registry the design names); filled by the family modules.
LOWERINGS: dict[OpOverload, Lowering] = {}

# Random ops: their lowering takes ``key=``. The recorder gives each such node a key.
RANDOM_OPS: set[OpOverload] = set()

# Shape functions for ops PyTorch has no meta kernel for: called like the op, on meta
# tensors, they return its outputs as meta tensors (used by the recorder's shape inference).
META_FUNCTIONS: dict[OpOverload, Callable[..., object]] = {}


def lowers(*ops: OpOverload, random: bool = False) -> Callable[[Lowering], Lowering]:
    """Register ``fn`` as the lowering of each overload in ``ops``.

    Example::

        @lowers(aten.neg.default)
        def neg(meta, x):
            return jnp.negative(x).astype(meta.dtype)
    """

    def register(fn: Lowering) -> Lowering:
        for op in ops:
            if op in LOWERINGS:
                raise ValueError(f"torchspmd: {op} already has a lowering ({LOWERINGS[op].__name__})")
            LOWERINGS[op] = fn
            if random:
                RANDOM_OPS.add(op)
        return fn

    return register


def infers(*ops: OpOverload) -> Callable[[Lowering], Lowering]:
    """Register ``fn`` as the shape function of ops that lack a PyTorch meta kernel.

    Example::

        @infers(aten.multi_margin_loss_backward.default)
        def _like_self(grad_output, self, *rest, **kwargs):
            return self.new_empty(self.shape)
    """

    def register(fn):
        for op in ops:
            META_FUNCTIONS[op] = fn
        return fn

    return register
