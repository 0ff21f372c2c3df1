"""The device mesh: a logical n-d grid over (a subset of) the JAX devices.

Same API and error messages as PyTorch/XLA's ``torch_xla.distributed.spmd.Mesh``, with one
extension: the device ids may be any subset of the devices, in any order (sub-meshes).
Device id ``i`` is ``jax.devices()[i]``. Ids are global: with several processes they count
every process's devices, process 0's first (PyTorch/XLA's global ordinals).

A ``Mesh`` is a value: two meshes with the same ids, shape and axis names are equal and
hash alike, so per-spec results can be cached on the instance.
"""

from __future__ import annotations

import ast
import math
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

import torchspmd.jax_setup  # noqa: F401  (must configure JAX before its backend starts)
import jax

__all__ = [
    "Mesh",
    "HybridMesh",
    "get_1d_mesh",
    "set_global_mesh",
    "get_global_mesh",
    "unnamed_axis_name",
]


def unnamed_axis_name(index: int) -> str:
    """The JAX axis name given to axis ``index`` of a mesh without axis names.

    JAX meshes need names; an unnamed ``Mesh`` gets ``"_0", "_1", ...``.

    >>> unnamed_axis_name(1)
    '_1'
    """
    return f"_{index}"


def _global_device_count() -> int:
    return len(jax.devices())


class Mesh:
    """A logical mesh of device ids, reshaped row-major to ``mesh_shape``.

    Args:
      device_ids: flat device ids (``jax.devices()[i]`` is device ``i``); any subset of
        the devices, in any order.
      mesh_shape: the size of each mesh axis; its product is ``len(device_ids)``.
      axis_names: one unique name per axis, or ``None``.

    >>> mesh = Mesh(np.arange(8), (4, 2), ("x", "y"))
    >>> mesh.shape()
    OrderedDict([('x', 4), ('y', 2)])
    >>> Mesh([2, 3], (1, 2), ("x", "y")).get_logical_mesh().tolist()
    [[2, 3]]
    """

    device_ids: np.ndarray
    mesh_shape: tuple[int, ...]
    axis_names: tuple[str, ...] | None

    def __init__(
        self,
        device_ids: np.ndarray | Sequence[int],
        mesh_shape: Sequence[int],
        axis_names: Sequence[str] | None = None,
    ):
        ids = np.array(device_ids)
        shape = _mesh_shape(mesh_shape)
        names = _axis_names(axis_names)
        _validate(ids, shape, names)
        ids = ids.astype(np.int64).reshape(-1)
        # Shared and hashed: an in-place edit would corrupt caches and equality.
        ids.flags.writeable = False
        self.device_ids = ids
        self.mesh_shape = shape
        self.axis_names = names
        self._jax_mesh: jax.sharding.Mesh | None = None
        self._cache: dict[Hashable, Any] = {}

    # -- PyTorch/XLA API --------------------------------------------------------------

    def size(self) -> int:
        """Number of devices in the mesh.

        >>> Mesh([0, 1, 2, 3], (2, 2)).size()
        4
        """
        return math.prod(self.mesh_shape)

    def shape(self) -> OrderedDict:
        """Axis name (or index, if unnamed) -> axis size.

        >>> Mesh([0, 1, 2, 3], (2, 2)).shape()
        OrderedDict([(0, 2), (1, 2)])
        """
        keys = self.axis_names if self.axis_names is not None else range(len(self.mesh_shape))
        return OrderedDict(zip(keys, self.mesh_shape))

    def get_logical_mesh(self) -> np.ndarray:
        """The device ids reshaped row-major to ``mesh_shape``.

        >>> Mesh([3, 2, 1, 0], (2, 2)).get_logical_mesh().tolist()
        [[3, 2], [1, 0]]
        """
        return self.device_ids.reshape(self.mesh_shape)

    def get_axis_name_idx(self, name: str) -> int | None:
        """Index of the axis called ``name``; ``None`` if absent or the mesh is unnamed.

        (PyTorch/XLA raises TypeError on an unnamed mesh; ``None`` is friendlier.)

        >>> Mesh([0, 1], (1, 2), ("x", "y")).get_axis_name_idx("y")
        1
        """
        if self.axis_names is None or name not in self.axis_names:
            return None
        return self.axis_names.index(name)

    def __str__(self) -> str:
        return (
            f"{{'device_ids': {self.device_ids.tolist()}, "
            f"'mesh_shape': {self.mesh_shape}, "
            f"'axis_names': {self.axis_names}}}"
        )

    def __repr__(self) -> str:
        return f"Mesh({self})"

    @classmethod
    def from_str(cls, mesh_str: str) -> Mesh | None:
        """Rebuild a mesh from ``str(mesh)``; ``None`` if the text does not parse.

        >>> m = Mesh([0, 1], (1, 2), ("x", "y"))
        >>> Mesh.from_str(str(m)) == m
        True
        """
        try:
            fields = ast.literal_eval(mesh_str.replace("Mesh", ""))
            return cls(
                device_ids=np.array(fields["device_ids"]),
                mesh_shape=fields["mesh_shape"],
                axis_names=fields["axis_names"],
            )
        except (ValueError, SyntaxError, KeyError, TypeError):
            return None

    # -- value semantics --------------------------------------------------------------

    def _key(self) -> tuple:
        return (tuple(self.device_ids.tolist()), self.mesh_shape, self.axis_names)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mesh):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    # -- JAX side ---------------------------------------------------------------------

    def device_set(self) -> frozenset[int]:
        """The ids of the mesh's devices.

        >>> sorted(Mesh([3, 1], (2,)).device_set())
        [1, 3]
        """
        return frozenset(self.device_ids.tolist())

    def jax_devices(self) -> list:
        """The JAX devices of the mesh, flat, in mesh (row-major) order.

        Example::

            >>> [d.id for d in Mesh([3, 1], (2,)).jax_devices()]
            [3, 1]
        """
        devices = jax.devices()
        return [devices[i] for i in self.device_ids.tolist()]

    def jax_axis_names(self) -> tuple[str, ...]:
        """The axis names of the JAX mesh (generated ``_0, _1, ...`` if unnamed).

        >>> Mesh([0, 1], (1, 2)).jax_axis_names()
        ('_0', '_1')
        """
        if self.axis_names is not None:
            return self.axis_names
        return tuple(unnamed_axis_name(i) for i in range(len(self.mesh_shape)))

    def get_jax_mesh(self) -> jax.sharding.Mesh:
        """The equivalent ``jax.sharding.Mesh`` (cached).

        Unnamed meshes get the axis names ``"_0", "_1", ...`` (see ``unnamed_axis_name``).

        >>> Mesh([0, 1], (1, 2)).get_jax_mesh().axis_names
        ('_0', '_1')
        """
        if self._jax_mesh is None:
            grid = np.empty(self.size(), dtype=object)
            grid[:] = self.jax_devices()
            self._jax_mesh = jax.sharding.Mesh(
                grid.reshape(self.mesh_shape), self.jax_axis_names()
            )
        return self._jax_mesh

    def cached(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """Return ``compute()``, memoized on this mesh under ``key``.

        Used for per-partition-spec results (shardings, HLO strings).

        >>> m = Mesh([0, 1], (2,))
        >>> m.cached("answer", lambda: 42)
        42
        """
        try:
            return self._cache[key]
        except KeyError:
            value = self._cache[key] = compute()
            return value


def _mesh_shape(mesh_shape: Any) -> tuple[int, ...]:
    """``mesh_shape`` as a tuple of ints >= 1, or a TypeError/ValueError saying what is wrong."""
    if isinstance(mesh_shape, (str, bytes)) or not hasattr(mesh_shape, "__iter__"):
        raise TypeError(f"Mesh: mesh_shape must be a sequence of ints, one per mesh axis, e.g. "
                        f"(2, 4) or (8,); got {mesh_shape!r}")
    shape = tuple(mesh_shape)
    if not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in shape):
        raise TypeError(f"Mesh: mesh_shape entries must be ints, got {shape!r}")
    shape = tuple(int(s) for s in shape)
    if any(s < 1 for s in shape):
        raise ValueError(f"Mesh: every mesh_shape entry must be >= 1, got {shape}")
    return shape


def _axis_names(axis_names: Any) -> tuple[str, ...] | None:
    """``axis_names`` as a tuple of strings (or None)."""
    if axis_names is None:
        return None
    if isinstance(axis_names, str) or not hasattr(axis_names, "__iter__"):
        raise TypeError(f"Mesh: axis_names must be a sequence of strings, one per mesh axis, "
                        f"e.g. ('data', 'model'); got {axis_names!r}")
    names = tuple(axis_names)
    if not all(isinstance(n, str) for n in names):
        raise TypeError(f"Mesh: axis names must be strings, got {names!r} (an int name would "
                        f"be ambiguous with a mesh axis index in partition specs)")
    return names


class InvalidShardingError(ValueError, AssertionError):
    """A mesh or partition spec that cannot be: PyTorch/XLA raises ``AssertionError`` with
    the same message, so this is one too (``except AssertionError`` still catches it), and
    a ``ValueError``. Raised explicitly: ``python -O`` strips ``assert`` statements, and
    the checks with them.

    >>> Mesh([0, 1], (3,))  # doctest: +SKIP
    InvalidShardingError: Number of device IDs (2) must match mesh size (3)
    """


def check(condition: bool, message: str) -> None:
    """Raise :class:`InvalidShardingError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise InvalidShardingError(message)


def _validate(ids: np.ndarray, shape: tuple[int, ...], names: tuple[str, ...] | None) -> None:
    """PyTorch/XLA's checks, in its order, relaxed to allow sub-meshes (spec §1.3, §4.7)."""
    n_global = _global_device_count()
    check(n_global > 0, "This requires XLA supported device(s).")
    if ids.size == 0:
        raise ValueError("Mesh: a mesh needs at least one device; device_ids is empty")
    if ids.dtype.kind not in "iu":
        raise TypeError(f"Mesh: device_ids must be ints (indices into jax.devices()), got "
                        f"{ids.reshape(-1).tolist()!r}")
    check((ids >= 0).all(),
          f"Device IDs must be non-negative (indices into jax.devices(), 0 to {n_global - 1}), "
          f"got: {ids}")
    check(len(ids) <= n_global,
          f"Number of device IDs ({len(ids)}) must be less than or equal to the global "
          f"number of devices ({n_global})")
    if names is not None:
        check(len(shape) == len(names),
              f"Number of axis names ({len(names)}) must match mesh dimensions ({len(shape)})")
        check(len(set(names)) == len(names), f"Axis names must be unique, got: {names}")
    expected = math.prod(shape)
    check(len(ids) == expected,
          f"Number of device IDs ({len(ids)}) must match mesh size ({expected})")
    check(len(ids) == len(np.unique(ids)), f"Device IDs must be unique, got: {ids}")
    check(all(0 <= int(d) < n_global for d in ids.reshape(-1)),
          f"Device IDs must be less than the global number of devices ({n_global}), got: {ids}")


_GLOBAL_MESH: Mesh | None = None


def set_global_mesh(mesh: Mesh | None) -> None:
    """Set the process-wide default mesh (``None`` clears it).

    >>> set_global_mesh(get_1d_mesh("data"))
    """
    if mesh is not None and not isinstance(mesh, Mesh):
        raise TypeError(f"set_global_mesh: mesh must be a torchspmd Mesh or None, got "
                        f"{type(mesh).__qualname__}. Build one with Mesh(device_ids, "
                        f"mesh_shape, axis_names).")
    global _GLOBAL_MESH
    _GLOBAL_MESH = mesh


def get_global_mesh() -> Mesh | None:
    """The mesh set by ``set_global_mesh``, or ``None``.

    >>> set_global_mesh(None); get_global_mesh() is None
    True
    """
    return _GLOBAL_MESH


def get_1d_mesh(axis_name: str | None = None) -> Mesh:
    """A 1-d mesh over all devices, in id order.

    >>> get_1d_mesh("data").axis_names
    ('data',)
    """
    n = _global_device_count()
    names = (axis_name,) if axis_name is not None else None
    return Mesh(np.arange(n), (n,), names)


class HybridMesh(Mesh):
    """A mesh whose axes combine fast (ICI) and slow (DCN, across slices) links.

    Keyword-only, as in PyTorch/XLA. The mesh shape is ``ici * dcn`` elementwise. On TPU
    slices (devices with a ``slice_index``) the DCN axes run across slices. Elsewhere the
    DCN axes run across processes: with several processes, ``prod(dcn_mesh_shape)`` must
    be the process count and ``prod(ici_mesh_shape)`` the devices per process (JAX's
    ``create_hybrid_device_mesh(process_is_granule=True)``); an all-ones
    ``dcn_mesh_shape`` lays all devices out in global id order. In one process only an
    all-ones ``dcn_mesh_shape`` is valid (on TPU, JAX's ``mesh_utils`` picks a
    topology-aware order within a slice).

    >>> HybridMesh(ici_mesh_shape=(2, 4), axis_names=("data", "model")).mesh_shape
    (2, 4)
    """

    ici_mesh_shape: tuple[int, ...]
    dcn_mesh_shape: tuple[int, ...]

    def __init__(
        self,
        *,
        ici_mesh_shape: Sequence[int],
        dcn_mesh_shape: Sequence[int] | None = None,
        axis_names: Sequence[str] | None = None,
    ):
        ici = tuple(int(s) for s in ici_mesh_shape)
        dcn = (1,) * len(ici) if dcn_mesh_shape is None else tuple(int(s) for s in dcn_mesh_shape)
        if len(ici) != len(dcn):
            raise ValueError(
                f"ici_mesh_shape {ici} and dcn_mesh_shape {dcn} must have the same length"
            )
        devices = torchspmd.jax_setup.devices()
        # CPU devices of several processes report slice_index 0: one slice, no multislice.
        multislice = len({getattr(d, "slice_index", None) for d in devices} - {None}) > 1
        by_process = not multislice and jax.process_count() > 1 and math.prod(dcn) > 1
        if multislice and math.prod(dcn) == 1:
            raise ValueError("Provide dcn_mesh_shape to create a mesh for multislice")
        if not multislice and jax.process_count() == 1 and math.prod(dcn) > 1:
            raise ValueError("Invalid dcn_mesh_shape for single slice mesh")
        if by_process and math.prod(dcn) != jax.process_count():
            raise ValueError(
                f"dcn_mesh_shape {dcn} spans {math.prod(dcn)} processes, but there are "
                f"{jax.process_count()}: across processes, the DCN axes are the processes"
            )
        mesh_shape = tuple(i * d for i, d in zip(ici, dcn))
        if math.prod(mesh_shape) != len(devices):
            raise ValueError(
                f"HybridMesh shape {mesh_shape} (ici {ici} * dcn {dcn}) has "
                f"{math.prod(mesh_shape)} devices, but there are {len(devices)} devices"
            )
        self.ici_mesh_shape = ici
        self.dcn_mesh_shape = dcn
        ids = _hybrid_device_ids(devices, ici, dcn, multislice, by_process)
        super().__init__(ids, mesh_shape, axis_names)


def _hybrid_device_ids(
    devices: list, ici: tuple[int, ...], dcn: tuple[int, ...], multislice: bool,
    by_process: bool
) -> np.ndarray:
    from jax.experimental import mesh_utils

    if multislice or by_process:
        grid = mesh_utils.create_hybrid_device_mesh(
            ici, dcn, devices, process_is_granule=by_process)
    elif devices[0].platform == "tpu":
        grid = mesh_utils.create_device_mesh(ici, devices)
    else:
        return np.arange(len(devices))
    return np.vectorize(torchspmd.jax_setup.device_id, otypes=[np.int64])(grid).reshape(-1)
