"""XLA's numbers for one layer under one candidate: compile its training program, read them.

The program of a linear (or embedding) layer is what a training step does with it:
forward, backward (``jax.vjp``) and the optimizer's update of the weight and its moments,
with the weight, moments and activations laid out as the candidate says and the weight
and moments donated, as ``torchspmd.compile`` donates them. It is lowered from shapes
alone (nothing runs) and compiled; :class:`Measured` holds the per-device
``cost_analysis()``, ``memory_analysis()`` and the collectives of the optimized HLO.
Programs are keyed by everything that shapes them, so the same layer kind is compiled
once however many layers have it.

Example::

    programs = Programs(mesh, slots=2)
    measured = programs.measure(layer, ("model", None), ((None, "data"), ...))  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from torchspmd.auto_shard.collectives import Collective, read_compiled
from torchspmd.auto_shard.roles import Layer
from torchspmd.sharding import Mesh
from torchspmd.sharding.partition_spec import named_sharding

__all__ = ["Measured", "Programs"]


@dataclasses.dataclass(frozen=True)
class Measured:
    """Per-device numbers of one compiled layer program."""

    flops: float
    bytes_accessed: float
    collectives: tuple[Collective, ...]
    argument_bytes: int
    temp_bytes: int


def _linear(out_dim: int):
    def forward(w, x):
        return x @ (w.T if out_dim == 0 else w)
    return forward


def _embedding(w, idx):
    return jnp.take(w, idx, axis=0)


def _program(layer: Layer, slots: int):
    """The layer's forward, backward and AdamW-like update (``slots`` moments)."""
    forward = _embedding if layer.kind == "embedding" else _linear(layer.out_dim)

    def step(w, moments, x, gy):
        if layer.kind == "embedding":
            y, vjp = jax.vjp(lambda w: forward(w, x), w)
            (gw,), gx = vjp(gy), None
        else:
            y, vjp = jax.vjp(forward, w, x)
            gw, gx = vjp(gy)
        moments = list(moments)
        if slots >= 1:
            moments[0] = 0.9 * moments[0] + 0.1 * gw
        if slots >= 2:
            moments[1] = 0.999 * moments[1] + 0.001 * gw * gw
            gw = moments[0] / (jnp.sqrt(moments[1]) + 1e-8)
        elif slots == 1:
            gw = moments[0]
        return y, gx, w - 1e-3 * gw, tuple(moments)

    return step


class Programs:
    """Compiles and measures layer programs on ``mesh``, each kind once."""

    def __init__(self, mesh: Mesh, slots: int):
        self.mesh = mesh
        self.slots = slots
        self.compiled = 0
        self._seen: dict[tuple, Measured] = {}

    def measure(self, layer: Layer, w_spec: tuple, act_specs: tuple[tuple, tuple]) -> Measured:
        """:class:`Measured` of ``layer``'s program with weight spec ``w_spec`` and
        activation specs ``(input, output)``."""
        key = (layer.kind, layer.shape, layer.out_dim, layer.activation, layer.dtype,
               w_spec, act_specs)
        if key not in self._seen:
            self._seen[key] = self._compile(layer, w_spec, act_specs)
        return self._seen[key]

    def _compile(self, layer: Layer, w_spec: tuple, act_specs) -> Measured:
        x_spec, y_spec = act_specs
        dtype = jnp.dtype(layer.dtype)
        w_sharding = named_sharding(self.mesh, w_spec)
        x_sharding = named_sharding(self.mesh, x_spec)
        y_sharding = named_sharding(self.mesh, y_spec)
        if layer.kind == "embedding":
            x = jax.ShapeDtypeStruct(layer.activation, jnp.int32, sharding=x_sharding)
            y_shape = (*layer.activation, layer.shape[1])
        else:
            x = jax.ShapeDtypeStruct(layer.activation, dtype, sharding=x_sharding)
            y_shape = (*layer.activation[:-1], layer.shape[layer.out_dim])
        w = jax.ShapeDtypeStruct(layer.shape, dtype, sharding=w_sharding)
        moments = tuple(w for _ in range(self.slots))
        gy = jax.ShapeDtypeStruct(y_shape, dtype, sharding=y_sharding)
        gx_sharding = None if layer.kind == "embedding" else x_sharding
        jitted = jax.jit(_program(layer, self.slots),
                         in_shardings=(w_sharding, (w_sharding,) * self.slots,
                                       x_sharding, y_sharding),
                         out_shardings=(y_sharding, gx_sharding, w_sharding,
                                        (w_sharding,) * self.slots),
                         donate_argnums=(0, 1))
        compiled = jitted.lower(w, moments, x, gy).compile()
        self.compiled += 1
        costs = read_compiled(compiled, self.mesh.size())
        return Measured(costs.flops, costs.bytes_accessed, costs.collectives,
                        int(costs.memory.argument_size_in_bytes), int(costs.memory.temp_size_in_bytes))
