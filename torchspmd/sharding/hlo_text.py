"""PyTorch/XLA's sharding strings (``xla::HloSharding::ToString``, V1 form).

- ``{replicated}``, ``{manual}``, ``{maximal device=3}``
- ``{devices=[2,4]0,1,2,3,4,5,6,7}``: tiles per dim, then the device ids of the tile grid,
  row-major.
- ``{devices=[2,1,4]0,...,7 last_tile_dim_replicate}``: partial; each run of 4 ids shares a
  tile.
- ``{devices=[2,1,2,2]... last_tile_dims={manual, replicated}}``: subgroup form.

The V2 (iota) forms that XLA and JAX print today, e.g. ``{devices=[1,8]<=[8]}`` or
``{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}``, are parsed and converted to V1.

Device ids in these strings are always REAL device ids (``jax.devices()[i]``), also for
sub-meshes: ``Mesh([2, 3], (1, 2))`` sharded ``(0, 1)`` is ``{devices=[1,2]2,3}``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from torchspmd.jax_setup import device_id  # (configures JAX before its backend starts)
from torchspmd.lowering import jax_private
import jax

from torchspmd.sharding.partition_spec import MeshSpec

__all__ = [
    "ShardingType",
    "ParsedSharding",
    "REPLICATED_TEXT",
    "MANUAL_TEXT",
    "format_tiled",
    "spec_to_hlo_text",
    "sharding_type",
    "sharding_to_hlo_text",
    "parse_hlo_text",
    "v2_to_v1",
]

REPLICATED_TEXT = "{replicated}"
MANUAL_TEXT = "{manual}"


class ShardingType(IntEnum):
    """PyTorch/XLA's sharding kinds (values follow ``xla::OpSharding::Type``).

    >>> ShardingType(5)
    <ShardingType.PARTIAL: 5>
    """

    REPLICATED = 0
    MAXIMAL = 1
    TUPLE = 2
    TILED = 3
    MANUAL = 4
    PARTIAL = 5
    UNKNOWN = 6


@dataclass(frozen=True)
class ParsedSharding:
    """A sharding string, taken apart.

    ``tile_dims`` includes the trailing subgroup dims (the replicated one for PARTIAL);
    ``device_ids`` are the tile grid's ids, row-major (empty for ``{replicated}``,
    ``{manual}``); ``subgroup_types`` names the trailing dims of the
    ``last_tile_dims={...}`` form (``("replicated",)`` when ``replicate_last``).

    >>> p = parse_hlo_text("{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}")
    >>> p.kind, p.data_tile_dims, p.replication
    (<ShardingType.PARTIAL: 5>, (2, 1), 4)
    """

    kind: ShardingType
    tile_dims: tuple[int, ...] = ()
    device_ids: tuple[int, ...] = ()
    replicate_last: bool = False
    subgroup_types: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Keep the two spellings of "last dim is replicated" consistent.
        if self.replicate_last and not self.subgroup_types:
            object.__setattr__(self, "subgroup_types", ("replicated",))

    @property
    def num_subgroup_dims(self) -> int:
        """How many trailing ``tile_dims`` are not tensor dims."""
        return len(self.subgroup_types)

    @property
    def data_tile_dims(self) -> tuple[int, ...]:
        """Tiles per tensor dim (``tile_dims`` without the subgroup dims)."""
        return self.tile_dims[: len(self.tile_dims) - self.num_subgroup_dims]

    @property
    def replication(self) -> int:
        """How many devices share each tile (product of the subgroup dims)."""
        return math.prod(self.tile_dims[len(self.data_tile_dims):])

    def to_v1(self) -> str:
        """The V1 string, as parsed (not normalized)."""
        return _format(self)


# -- formatting ----------------------------------------------------------------------


def _format(p: ParsedSharding) -> str:
    if p.kind is ShardingType.REPLICATED:
        return REPLICATED_TEXT
    if p.kind is ShardingType.MANUAL:
        return MANUAL_TEXT
    if p.kind is ShardingType.UNKNOWN:
        return "{unknown}"
    if p.kind is ShardingType.MAXIMAL:
        return f"{{maximal device={p.device_ids[0]}}}"
    text = f"{{devices=[{','.join(map(str, p.tile_dims))}]{','.join(map(str, p.device_ids))}"
    if p.replicate_last:
        text += " last_tile_dim_replicate"
    elif p.subgroup_types:
        text += f" last_tile_dims={{{', '.join(p.subgroup_types)}}}"
    return text + "}"


def _normalized(
    tile_dims: Sequence[int], device_ids: Sequence[int], subgroup_types: Sequence[str]
) -> ParsedSharding:
    """XLA's canonical form: size-1 subgroup dims dropped, trivial tilings collapsed."""
    n_data = len(tile_dims) - len(subgroup_types)
    data = tuple(int(t) for t in tile_dims[:n_data])
    kept = [(k, int(t)) for k, t in zip(subgroup_types, tile_dims[n_data:]) if t != 1]
    ids = tuple(int(i) for i in device_ids)
    kinds = {k for k, _ in kept}
    if all(t == 1 for t in data) and len(kinds) <= 1:
        kind = ShardingType.MANUAL if kinds == {"manual"} else ShardingType.REPLICATED
        return ParsedSharding(kind)
    dims = data + tuple(t for _, t in kept)
    if not kept:
        return ParsedSharding(ShardingType.TILED, dims, ids)
    if [k for k, _ in kept] == ["replicated"]:
        return ParsedSharding(ShardingType.PARTIAL, dims, _ascending_groups(ids, kept[0][1]),
                              True, ("replicated",))
    return ParsedSharding(ShardingType.TILED, dims, ids, False, tuple(k for k, _ in kept))


def _ascending_groups(ids: tuple[int, ...], group: int) -> tuple[int, ...]:
    """Each run of ``group`` ids (the devices sharing a tile) in ascending order.

    PyTorch/XLA lists a replication group's devices sorted (``CreateOpSharding``), so on a
    mesh whose ids are not in order the string, and each shard's ``replica_id``, follow id
    order. Which tile a device holds does not change.

    >>> _ascending_groups((1, 7, 4, 2), 2)
    (1, 7, 2, 4)
    """
    return tuple(i for start in range(0, len(ids), group)
                 for i in sorted(ids[start:start + group]))


def format_tiled(
    tile_dims: Sequence[int],
    device_ids: Sequence[int],
    replicate_last: bool = False,
    subgroup_types: Sequence[str] = (),
) -> str:
    """Format a tile assignment as XLA would print it (normalized).

    >>> format_tiled([2, 1, 4], range(8), replicate_last=True)
    '{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}'
    >>> format_tiled([1, 1, 8], range(8), replicate_last=True)
    '{replicated}'
    """
    types = ("replicated",) if replicate_last else tuple(subgroup_types)
    if len(device_ids) != math.prod(tile_dims):
        raise ValueError(f"{len(device_ids)} device ids for tile dims {list(tile_dims)}")
    return _format(_normalized(tile_dims, device_ids, types))


# -- from a partition spec -----------------------------------------------------------


def spec_to_hlo_text(spec: MeshSpec) -> str:
    """The sharding string PyTorch/XLA gives a tensor marked with ``spec`` (cached).

    Follows ``_get_tile_assignment`` / ``_get_group_assignment`` (spec §2): the mesh is
    transposed to (sharded axes in spec order, then unused axes, sorted), tuple entries
    are merged, and the unused axes become the replicated last tile dim.

    >>> from torchspmd.sharding.mesh import Mesh
    >>> from torchspmd.sharding.partition_spec import resolve
    >>> spec_to_hlo_text(resolve(Mesh(range(8), (2, 4)), (0, None)))
    '{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}'
    """
    return spec.mesh.cached(("hlo_text", spec.axes), lambda: _spec_to_hlo_text(spec))


def sharding_type(spec: MeshSpec) -> ShardingType:
    """The ``ShardingType`` PyTorch/XLA reports for a tensor marked with ``spec``.

    Read back from the final (XLA-normalized) string, like ``.sharding_type``: so on a
    (1, 8) mesh ``(None, 1)`` is TILED and ``(0, None)`` is REPLICATED (spec §1.4).

    >>> from torchspmd.sharding.mesh import Mesh
    >>> from torchspmd.sharding.partition_spec import resolve
    >>> sharding_type(resolve(Mesh(range(8), (1, 8)), (None, 1))).name
    'TILED'
    """
    return parse_hlo_text(spec_to_hlo_text(spec)).kind


def _spec_to_hlo_text(spec: MeshSpec) -> str:
    mesh, norm = spec.mesh, spec.axes
    if mesh.size() == 1 or all(e is None for e in norm):
        return REPLICATED_TEXT
    sizes = mesh.mesh_shape
    perm = [axis for entry in norm if entry is not None for axis in entry]
    missing = sorted(set(range(len(sizes))) - set(perm))
    # After this transpose each tile's devices are contiguous, tiles in row-major order,
    # so the flat order is both the tile grid and the group-by-group listing.
    ids = mesh.get_logical_mesh().transpose(perm + missing).reshape(-1).tolist()
    counts = [math.prod(sizes[a] for a in entry) if entry else 1 for entry in norm]
    if not missing:
        return format_tiled(counts, ids)
    replication = math.prod(sizes[a] for a in missing)
    return format_tiled(counts + [replication], ids, replicate_last=True)


# -- from a JAX sharding -------------------------------------------------------------


def sharding_to_hlo_text(sharding: jax.sharding.Sharding, ndim: int) -> str:
    """The V1 string of a JAX sharding for a rank-``ndim`` array, with real device ids.

    A sharding over a single device (``SingleDeviceSharding`` included) is reported as
    ``{replicated}``: its one device holds the whole array, as with PyTorch/XLA's
    single-device SPMD.

    >>> from torchspmd.sharding.mesh import Mesh
    >>> from torchspmd.sharding.partition_spec import resolve
    >>> sharding_to_hlo_text(resolve(Mesh([2, 3], (1, 2)), (0, 1)).named_sharding, 2)
    '{devices=[1,2]2,3}'
    """
    if len(sharding.device_set) == 1:
        return REPLICATED_TEXT
    tiles = jax_private.tile_layout(sharding, ndim)
    if tiles.replicated:
        return REPLICATED_TEXT
    if tiles.manual:
        return MANUAL_TEXT
    assignment = jax_private.device_assignment(sharding)
    real_ids = [device_id(assignment[pos]) for pos in tiles.devices]
    if tiles.maximal:
        return f"{{maximal device={real_ids[0]}}}"
    return format_tiled(
        tiles.dims,
        real_ids,
        replicate_last=tiles.replicate_last,
        subgroup_types=list(tiles.subgroups),
    )


# -- parsing -------------------------------------------------------------------------

_DEVICES_RE = re.compile(
    r"^\{devices=\[(?P<dims>\d+(?:,\d+)*)\]"
    r"(?:<=\[(?P<iota>\d+(?:,\d+)*)\](?:T\((?P<perm>\d+(?:,\d+)*)\))?"
    r"|(?P<ids>\d+(?:,\d+)*))"
    r"(?P<last> last_tile_dim_replicate| last_tile_dims=\{(?P<types>[a-z]+(?:, ?[a-z]+)*)\})?"
    r"\}$"
)
_SIMPLE = {
    REPLICATED_TEXT: ShardingType.REPLICATED,
    MANUAL_TEXT: ShardingType.MANUAL,
    "{unknown}": ShardingType.UNKNOWN,
}


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def _iota_ids(reshape: tuple[int, ...], perm: tuple[int, ...] | None) -> tuple[int, ...]:
    ids = np.arange(math.prod(reshape)).reshape(reshape)
    if perm is not None:
        ids = ids.transpose(perm)
    return tuple(ids.reshape(-1).tolist())


def parse_hlo_text(text: str) -> ParsedSharding:
    """Parse a V1 or V2 sharding string (raises ValueError if it is neither).

    >>> parse_hlo_text("{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}").device_ids
    (0, 4, 1, 5, 2, 6, 3, 7)
    """
    text = text.strip()
    if text in _SIMPLE:
        return ParsedSharding(_SIMPLE[text])
    maximal = re.fullmatch(r"\{maximal device=(\d+)\}", text)
    if maximal:
        return ParsedSharding(ShardingType.MAXIMAL, (), (int(maximal.group(1)),))
    match = _DEVICES_RE.match(text)
    if match is None:
        raise ValueError(f"Unrecognized sharding string: {text!r}")
    dims = _ints(match["dims"])
    if match["iota"] is not None:
        ids = _iota_ids(_ints(match["iota"]), _ints(match["perm"]) if match["perm"] else None)
    else:
        ids = _ints(match["ids"])
    if len(ids) != math.prod(dims):
        raise ValueError(f"Sharding string {text!r}: {len(ids)} devices for tile dims {list(dims)}")
    types: tuple[str, ...] = ()
    if match["types"]:
        types = tuple(t.strip() for t in match["types"].split(","))
    # `last_tile_dims={replicated}` is the long spelling of `last_tile_dim_replicate`.
    replicate_last = match["last"] == " last_tile_dim_replicate" or types == ("replicated",)
    # PyTorch/XLA's sharding_type: OTHER with replicate_on_last_tile_dim is PARTIAL,
    # any other tiling (subgroup forms included) is TILED.
    kind = ShardingType.PARTIAL if replicate_last else ShardingType.TILED
    return ParsedSharding(kind, dims, ids, replicate_last, types)


def v2_to_v1(text: str) -> str:
    """Rewrite a V2 (iota) sharding string in V1 form; V1 strings come back unchanged.

    >>> v2_to_v1("{devices=[1,8]<=[8]}")
    '{devices=[1,8]0,1,2,3,4,5,6,7}'
    """
    if "<=" not in text:
        return text
    return parse_hlo_text(text).to_v1()
