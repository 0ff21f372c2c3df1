"""``XLAShardedTensor``: a tensor wrapper that shows a global tensor and its device shards.

As in PyTorch/XLA's RFC, it is a wrapper subclass *around* an spmd device tensor (the
``global_tensor``): every op unwraps it, runs on the device tensor, and wraps tensor
results again (results carry no mesh or spec). It subclasses the device tensor type so
that PyTorch offers it every op first, whatever the argument order: ``w @ xst`` and
``xst @ w`` both reach this ``__torch_dispatch__``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from types import EllipsisType

import jax
import numpy as np
import torch
from torch.utils._pytree import tree_leaves, tree_map

from torchspmd.device.tensor import SpmdTensor
from torchspmd.jax_setup import device_id
from torchspmd.lazy.record import meta_of
from torchspmd.runtime import transfer
from torchspmd.runtime.execute import materialize
from torchspmd.runtime.array_regions import assemble, cropped, region
from torchspmd.sharding import state
from torchspmd.sharding.hlo_text import ShardingType, parse_hlo_text
from torchspmd.sharding.layout import ShardInfo, pad_shard, shard_layout
from torchspmd.sharding.partition_spec import resolve, spec_to_placements

__all__ = ["XLAShard", "XLAShardedTensor"]


@dataclass
class XLAShard:
    """One device's shard: a CPU snapshot of its (right-zero-padded) data and where it lies.

    ``indices`` is ``Ellipsis`` for replicated data, else one global slice per dim
    (clamped to the real shape); ``shard_device`` is like ``'CPU:3'``; ``replica_id`` is
    0 when tiled, the position in the replication group when partial, the device's
    position when replicated.

    >>> XLAShard(torch.tensor([8., 0.]), [slice(8, 9)], "CPU:4", 0).unpadded_data
    tensor([8.])
    """

    data: torch.Tensor
    indices: list[slice] | EllipsisType
    shard_device: str
    replica_id: int

    def _unpadded_index(self):
        if self.indices is Ellipsis:
            return Ellipsis
        return tuple(slice(0, s.stop - s.start) for s in self.indices)

    @property
    def unpadded_data(self) -> torch.Tensor:
        """``data`` without its padding."""
        return self.data[self._unpadded_index()]

    @unpadded_data.setter
    def unpadded_data(self, t: torch.Tensor) -> None:
        self.data[self._unpadded_index()] = t


def _device_name(device) -> str:
    return f"{device.platform.upper()}:{device_id(device)}"


class XLAShardedTensor(SpmdTensor):
    """A sharded view of an spmd tensor: ``global_tensor`` plus its mesh and spec.

    Works wherever a tensor does (modules, optimizers, autograd); ``sharding_spec``,
    ``sharding_type`` and ``local_shards`` read the device layout.

    >>> xst = XLAShardedTensor(torch.arange(8.).to("spmd"))
    >>> xst.sharding_spec
    ''
    """

    global_tensor: SpmdTensor
    mesh_shape: tuple[int, ...] | None
    partition_spec: tuple | None

    @staticmethod
    def __new__(cls, elem: torch.Tensor, mesh_shape=None, partition_spec=None, *,
                requires_grad: bool = False, mesh=None):
        inner = elem.global_tensor if isinstance(elem, XLAShardedTensor) else elem
        r = torch.Tensor._make_wrapper_subclass(
            cls, inner.size(), strides=inner.stride(), storage_offset=inner.storage_offset(),
            dtype=inner.dtype, layout=inner.layout, device=inner.device,
            requires_grad=requires_grad)
        # As in the RFC: a wrapper that is an autograd leaf must not share the elem's history.
        r.global_tensor = inner.detach() if requires_grad else inner
        inherited = elem if isinstance(elem, XLAShardedTensor) else None
        r.mesh_shape = mesh_shape or (inherited.mesh_shape if inherited is not None else None)
        r.partition_spec = partition_spec or (
            inherited.partition_spec if inherited is not None else None)
        r.mesh = mesh or (inherited.mesh if inherited is not None else None)
        r._cached_spec = None
        return r

    @property
    def _h(self):
        """The global tensor's lazy handle, so runtime helpers accept the wrapper."""
        return self.global_tensor.handle

    # -- sharding --------------------------------------------------------------------

    @property
    def sharding_spec(self) -> str:
        """The V1 sharding text of the global tensor (``''`` if it has none)."""
        return state.current_text(self.global_tensor)

    @property
    def sharding_type(self) -> ShardingType:
        """The ``ShardingType`` of ``sharding_spec`` (ValueError if unsharded, as PyTorch/XLA)."""
        text = self.sharding_spec
        if not text:
            raise ValueError("None is not a valid ShardingType")
        return parse_hlo_text(text).kind

    def invalidate_spec_cache(self) -> None:
        """Forget the cached :attr:`placements` (PyTorch/XLA's name)."""
        self._cached_spec = None

    @property
    def placements(self) -> tuple:
        """DTensor's view of ``mesh_shape`` and ``partition_spec``: per mesh dim,
        ``Shard(d)`` for the tensor dim ``d`` it splits, else ``Replicate()`` (ValueError
        without them, as PyTorch/XLA).

        >>> distribute_tensor(t, DeviceMesh("xla", torch.arange(8)), [Shard(0)]).placements
        (Shard(dim=0),)
        """
        if self._cached_spec is None:
            if self.mesh_shape is None or self.partition_spec is None:
                raise ValueError(
                    "Placements not available: XLAShardedTensor requires mesh_shape and "
                    "partition_spec to be set. Use mark_sharding() to properly initialize "
                    "sharding information.")
            # Names and indices alike, as the mesh resolves them (a bare mesh_shape,
            # from wrap_as_sharded_tensor, leaves only indices).
            spec = (resolve(self.mesh, self.partition_spec, self.dim()).axes
                    if self.mesh is not None else self.partition_spec)
            self._cached_spec = tuple(spec_to_placements(spec, range(len(self.mesh_shape))))
        return self._cached_spec

    # -- shards ----------------------------------------------------------------------

    def _materialized(self) -> tuple[jax.Array, str]:
        """The global tensor's array (running its graph) and its sharding text."""
        (array,) = materialize([state.current_value(self.global_tensor)])
        return array, self.sharding_spec

    def _layout(self, array: jax.Array, text: str) -> list[ShardInfo]:
        """The shards of this process's devices (all of them in one process)."""
        order = sorted(device_id(d) for d in array.sharding.device_set)
        mine = {device_id(d) for d in array.sharding.addressable_devices}
        return [info for info in shard_layout(text, tuple(self.shape), order)
                if info.device_id in mine]

    @property
    def local_shards(self) -> list[XLAShard]:
        """One ``XLAShard`` per device of this process, in device id order.

        Runs pending work first. With several processes only this process's devices
        are listed (their data is read locally: no collective).
        """
        array, text = self._materialized()
        if not text:
            raise RuntimeError("Tensor is not sharded")
        layout = self._layout(array, text)
        buffers = self._device_buffers(array, text)
        devices = {device_id(d): d for d in array.sharding.device_set}
        shards = []
        for info in layout:
            data = pad_shard(buffers(info), info.padded_shape)
            shards.append(XLAShard(transfer.to_torch(data), info.indices,
                                   _device_name(devices[info.device_id]), info.replica_id))
        return shards

    def _device_buffers(self, array: jax.Array, text: str):
        """A function ShardInfo -> numpy data of that (local) shard, unpadded.

        A device's own buffer is used only where it holds exactly the shard's region: the
        same sharding text can be laid over the devices in another order (a sub-mesh whose
        ids are permuted) and an uneven annotation keeps the data replicated (see
        ``state``); any other shard is cut from a copy of the whole value.
        """
        shape = tuple(array.shape)
        held = array.sharding.addressable_devices_indices_map(shape)
        per_device = {device_id(s.device): s for s in array.addressable_shards}
        whole: list[np.ndarray] = []

        def read(info: ShardInfo) -> np.ndarray:
            wanted = region((slice(None),) * len(shape) if info.indices is Ellipsis
                            else tuple(info.indices), shape)
            shard = per_device.get(info.device_id)
            if shard is not None and region(held[shard.device], shape) == wanted:
                return transfer.read_local(shard.data)
            if not whole:
                whole.append(transfer.download(array))
            return whole[0][tuple(slice(a, b) for a, b in wanted)]
        return read

    def load_local_shards_(self, shards: list[XLAShard]) -> None:
        """Replace the data with ``shards`` (padded, one per local device), keeping the sharding.

        With several processes each process passes the shards of its own devices, and
        every process must call it (the new value is assembled across processes).

        >>> xst.load_local_shards_([XLAShard(s.data * 2, ...) for s in xst.local_shards])
        """
        array, text = self._materialized()
        if not text:
            raise RuntimeError("Cannot load local shards into a non sharded tensor")
        layout = self._layout(array, text)
        if len(shards) != len(layout):
            raise RuntimeError("Shards must be provided for all local devices")
        if parse_hlo_text(text).kind is ShardingType.REPLICATED:
            raise RuntimeError(
                "Replicated tensor should not be loaded from _load_local_shards - use copy_")
        by_device = {s.shard_device: s for s in shards}
        names = {device_id(d): _device_name(d) for d in array.sharding.device_set}
        padded: dict[int, np.ndarray] = {}
        for info in layout:
            shard = by_device.get(names[info.device_id])
            if shard is None:
                raise RuntimeError("Shards must be provided for all local devices")
            _check_padded(shard.data, info.padded_shape)
            _check_dtype(shard, self.dtype)
            padded[info.device_id] = transfer.to_numpy(shard.data)
        value = state.current_value(self.global_tensor)
        sharding = state.jax_sharding_of(value)
        self.global_tensor.handle.assign(state.new_leaf(
            meta_of(value), array=_assemble(sharding, text, tuple(self.shape), array.dtype, padded),
            sharding=sharding))
        self.invalidate_spec_cache()

    # -- behaving like a tensor ------------------------------------------------------

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        wrappers = {}

        def unwrap(x):
            if isinstance(x, XLAShardedTensor):
                wrappers[id(x.global_tensor)] = x
                return x.global_tensor
            return x

        # Non-wrapper tensor arguments come back as themselves (``p.add_(xst)`` returns ``p``).
        plain = {id(a) for a in _tensors_in((args, kwargs)) if not isinstance(a, cls)}
        result = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))

        def wrap(x):
            if not isinstance(x, torch.Tensor):
                return x
            if id(x) in wrappers:  # an in-place op returns its (wrapped) argument
                return _refresh(wrappers[id(x)])
            if id(x) in plain or not isinstance(x, SpmdTensor):
                return x  # an unwrapped argument itself, or data that left the device
            return XLAShardedTensor(x)

        return tree_map(wrap, result)

    def __repr__(self, *, tensor_contents=None) -> str:
        return f"XLAShardedTensor({self.global_tensor})"

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        result = XLAShardedTensor(copy.deepcopy(self.global_tensor, memo), self.mesh_shape,
                                  self.partition_spec, requires_grad=self.requires_grad,
                                  mesh=self.mesh)
        memo[id(self)] = result
        return result


def _tensors_in(tree) -> list[torch.Tensor]:
    """The tensors in a pytree of arguments."""
    return [x for x in tree_leaves(tree) if isinstance(x, torch.Tensor)]


def _refresh(wrapper: XLAShardedTensor) -> XLAShardedTensor:
    """After an in-place op, make the wrapper's sizes follow its global tensor's (``t_()``)."""
    inner = wrapper.global_tensor
    if wrapper.shape != inner.shape or wrapper.stride() != inner.stride():
        with torch._C._DisableTorchDispatch():
            torch.ops.aten.as_strided_.default(wrapper, inner.shape, inner.stride())
    return wrapper


def _assemble(sharding, text: str, shape: tuple[int, ...], dtype,
              padded: dict[int, np.ndarray]) -> jax.Array:
    """The array whose devices hold ``padded`` (device id -> padded shard) under ``sharding``.

    An uneven sharding's data is stored replicated (see ``state``): the padded shards
    tile a padded array evenly, and one program crops it to ``shape`` and replicates it
    (moving data between processes when there are several).
    """
    placement = state.placement_for(sharding, shape)
    if placement is sharding:  # even tiles: the shards are the device buffers
        return assemble(shape, sharding, dtype, lambda d, _: padded[device_id(d)])
    tiles = parse_hlo_text(text).data_tile_dims
    padded_shape = tuple(t * -(-n // t) for n, t in zip(shape, tiles))
    whole = assemble(padded_shape, sharding, dtype, lambda d, _: padded[device_id(d)])
    return cropped(whole, shape, placement)


def _check_dtype(shard: XLAShard, dtype: torch.dtype) -> None:
    if shard.data.dtype != dtype:
        raise RuntimeError(
            f"load_local_shards_: the shard for {shard.shard_device} is {shard.data.dtype}, the "
            f"tensor is {dtype}; convert it first (shard.data.to({dtype})) so that no value is "
            f"rounded or truncated without you asking.")


def _check_padded(data: torch.Tensor, padded_shape: tuple[int, ...]) -> None:
    if tuple(data.shape) != tuple(padded_shape):
        raise RuntimeError(f"Input shard shape must include padding: {list(data.shape)} vs "
                           f"{','.join(map(str, padded_shape))}")
