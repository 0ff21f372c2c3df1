"""Which part of a global array each device holds (spec §1.8, §4.6).

Shards follow XLA's ``GetShardShape``: along a dim split in ``t`` tiles every shard is
``s = ceil(dim / t)`` long (the *padded* shape), and tile ``n`` holds the global indices
``[min(n*s, dim) : min((n+1)*s, dim)]``, so trailing shards may be short or empty and are
right-zero-padded on the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import EllipsisType

import numpy as np

import torchspmd.jax_setup  # noqa: F401
import jax

from torchspmd.sharding.hlo_text import ParsedSharding, ShardingType, parse_hlo_text

__all__ = ["ShardInfo", "shard_layout", "shard_indices", "pad_shard"]


@dataclass(frozen=True)
class ShardInfo:
    """One device's shard of a global array.

    ``indices`` is ``Ellipsis`` for a replicated array, else one slice per dim, clamped to
    the global shape; ``padded_shape`` is the (uniform) shape of the device buffer;
    ``replica_id`` is 0 when tiled, the position in the replication group when partial,
    and the device's position in the device order when replicated.

    >>> shard_layout("{devices=[2]0,1}", (3,))[1]
    ShardInfo(device_id=1, indices=[slice(2, 3, 1)], padded_shape=(2,), replica_id=0)
    """

    device_id: int
    indices: list[slice] | EllipsisType
    padded_shape: tuple[int, ...]
    replica_id: int

    @property
    def unpadded_shape(self) -> tuple[int, ...]:
        """The shape of the real data in this shard (``padded_shape`` minus padding)."""
        if self.indices is Ellipsis:
            return self.padded_shape
        return tuple(s.stop - s.start for s in self.indices)


def shard_indices(
    tile_coords: Sequence[int], tiles: Sequence[int], global_shape: Sequence[int]
) -> list[slice]:
    """The global slices held by the tile at ``tile_coords`` of a ``tiles`` grid.

    Steps are spelled out as 1, as PyTorch/XLA's ``XLAShard.indices`` are.

    >>> shard_indices((3,), (4,), (9,))
    [slice(9, 9, 1)]
    """
    out = []
    for n, t, dim in zip(tile_coords, tiles, global_shape):
        size = -(-dim // t)
        out.append(slice(min(n * size, dim), min((n + 1) * size, dim), 1))
    return out


def _padded_shape(tiles: Sequence[int], global_shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(-(-dim // t) for t, dim in zip(tiles, global_shape))


def _ordered(infos: dict[int, ShardInfo], device_order: Sequence[int] | None) -> list[ShardInfo]:
    order = sorted(infos) if device_order is None else [int(d) for d in device_order]
    if sorted(order) != sorted(infos):
        raise ValueError(
            f"device_order {list(order)} is not the sharding's device set {sorted(infos)}"
        )
    return [infos[d] for d in order]


def shard_layout(
    sharding: str | ParsedSharding,
    global_shape: Sequence[int],
    device_order: Sequence[int] | None = None,
) -> list[ShardInfo]:
    """Per-device shard geometry of a ``global_shape`` array with this sharding.

    The result lists each device of the sharding once, in ``device_order`` (e.g. a
    mesh's ``device_ids``); by default in increasing id order, which is PyTorch/XLA's
    local-shard order. ``{replicated}`` (and ``''``) names no devices: it covers
    ``device_order``, by default all JAX devices, and ``replica_id`` is the position in
    that order. ``{maximal device=d}`` is one replicated shard on ``d``. ``{manual}`` has
    no global layout (ValueError).

    >>> [s.indices for s in shard_layout("{devices=[2]0,1}", (3,))]
    [[slice(0, 2, None)], [slice(2, 3, 1)]]
    """
    shape = tuple(int(d) for d in global_shape)
    parsed = _parse(sharding)
    if parsed.kind is ShardingType.REPLICATED:
        devices = range(len(jax.devices())) if device_order is None else device_order
        return [ShardInfo(int(d), Ellipsis, shape, i) for i, d in enumerate(devices)]
    if parsed.kind is ShardingType.MAXIMAL:
        device = parsed.device_ids[0]
        return _ordered({device: ShardInfo(device, Ellipsis, shape, 0)}, device_order)
    if parsed.kind in (ShardingType.MANUAL, ShardingType.UNKNOWN):
        raise ValueError(f"A {parsed.kind.name} sharding has no shard layout")
    return _ordered(_tiled_layout(parsed, shape), device_order)


def _parse(sharding: str | ParsedSharding) -> ParsedSharding:
    if isinstance(sharding, ParsedSharding):
        return sharding
    if sharding == "":  # unannotated data lives replicated on every device
        return ParsedSharding(ShardingType.REPLICATED)
    return parse_hlo_text(sharding)


def _tiled_layout(parsed: ParsedSharding, shape: tuple[int, ...]) -> dict[int, ShardInfo]:
    tiles = parsed.data_tile_dims
    if len(tiles) != len(shape):
        raise ValueError(
            f"Sharding with tile dims {list(tiles)} does not fit an array of rank {len(shape)}"
        )
    group = parsed.replication
    padded = _padded_shape(tiles, shape)
    infos = {}
    for pos, device in enumerate(parsed.device_ids):
        # Devices are listed tile by tile; the `group` devices of a tile are adjacent.
        coords = np.unravel_index(pos // group, tiles) if tiles else ()
        infos[device] = ShardInfo(
            device_id=device,
            indices=shard_indices([int(c) for c in coords], tiles, shape),
            padded_shape=padded,
            replica_id=pos % group,
        )
    return infos


def pad_shard(data: np.ndarray, padded_shape: Sequence[int]) -> np.ndarray:
    """Right-pad ``data`` with zeros up to ``padded_shape``.

    >>> pad_shard(np.array([8]), (2,)).tolist()
    [8, 0]
    """
    data = np.asarray(data)
    widths = [(0, int(p) - s) for s, p in zip(data.shape, padded_shape)]
    if len(padded_shape) != data.ndim or any(w < 0 for _, w in widths):
        raise ValueError(f"Cannot pad a shard of shape {data.shape} to {tuple(padded_shape)}")
    if not any(w for _, w in widths):
        return data
    return np.pad(data, widths)
