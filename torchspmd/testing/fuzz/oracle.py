"""What a fuzz program's results must be: CPU's values, shards that tile them, PyTorch/XLA's text.

Each check returns ``None`` when the spmd result is right, else a one-line description of
what differs. The sharding text is computed here from first principles (PyTorch/XLA's
``_get_tile_assignment``), independently of ``torchspmd.sharding.hlo_text``, so the two
can disagree. Example::

    >>> expected_sharding_text([2, 3, 0, 1], (2, 2), ("a", "b"), ("b", None))
    '{devices=[2,1,2]2,0,3,1 last_tile_dim_replicate}'
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

# Relative tolerance per dtype for values that went through rounding (see ``compare``).
_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 5e-2, torch.float64: 1e-7}


def _axes_of(entry, names: Sequence[str] | None) -> list[int]:
    """The mesh axes one partition-spec entry names (an index, a name, or a tuple of them)."""
    if entry is None:
        return []
    items = entry if isinstance(entry, tuple) else (entry,)
    return [names.index(e) if isinstance(e, str) else int(e) for e in items]


def expected_sharding_text(device_ids: Sequence[int], mesh_shape: Sequence[int],
                           axis_names: Sequence[str] | None, spec: Sequence) -> str:
    """PyTorch/XLA's V1 sharding text for ``spec`` over a mesh (real device ids).

    The mesh is transposed to (axes in spec order, then the unused axes in mesh order);
    each dim's tile count is the product of its axes; unused axes of size > 1 become a
    replicated last tile dim, whose groups of replicas list their ids in ascending order;
    a tiling of all ones is ``{replicated}``.

    >>> expected_sharding_text(range(8), (2, 4), None, (0, None))
    '{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}'
    """
    used = [_axes_of(e, axis_names) for e in spec]
    order = [a for axes in used for a in axes]
    rest = [a for a in range(len(mesh_shape)) if a not in order]
    tiles = [math.prod(mesh_shape[a] for a in axes) for axes in used]
    if all(t == 1 for t in tiles):
        return "{replicated}"
    grid = np.asarray(list(device_ids)).reshape(tuple(mesh_shape))
    ids = grid.transpose(order + rest).reshape(-1).tolist()
    replication = math.prod(mesh_shape[a] for a in rest)
    if replication > 1:  # PyTorch/XLA lists each group of replicas in ascending id order
        ids = [i for g in range(0, len(ids), replication) for i in sorted(ids[g:g + replication])]
    dims = tiles + ([replication] if replication > 1 else [])
    text = f"{{devices=[{','.join(map(str, dims))}]{','.join(map(str, ids))}"
    return text + (" last_tile_dim_replicate}" if replication > 1 else "}")


def compare(name: str, got: torch.Tensor, expected: torch.Tensor) -> str | None:
    """Whether ``got`` (from the device, on the CPU) equals CPU's ``expected``.

    Integers and booleans must be equal; floats agree to a tolerance relative to the
    largest magnitude in ``expected`` (XLA fuses and reorders reductions; bfloat16 rounds).
    """
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return (f"{name}: shape/dtype {tuple(got.shape)} {got.dtype}, CPU gives "
                f"{tuple(expected.shape)} {expected.dtype}")
    if not expected.is_floating_point():
        if torch.equal(got, expected):
            return None
        bad = (got != expected).nonzero()[0].tolist()
        return f"{name}: at {bad} got {got[tuple(bad)].item()}, CPU {expected[tuple(bad)].item()}"
    tol = _TOLERANCE.get(expected.dtype, 1e-3)
    finite = expected[expected.isfinite()]
    scale = max(1.0, finite.abs().max().item()) if finite.numel() else 1.0
    try:
        torch.testing.assert_close(got, expected, rtol=tol, atol=tol * scale, equal_nan=True)
    except AssertionError as e:
        detail = " ".join(str(e).split())
        return f"{name}: {detail[:300]}"
    return None


def _region(indices, shape: tuple[int, ...]) -> tuple[slice, ...]:
    if indices is Ellipsis:
        return tuple(slice(0, n) for n in shape)
    return tuple(slice(*s.indices(n)) for s, n in zip(indices, shape))


def check_shards(name: str, shards: list, expected: torch.Tensor) -> str | None:
    """Whether ``local_shards`` cover ``expected`` exactly, each holding its region's values.

    Every element must lie in some shard; every shard's unpadded data must equal CPU's
    value of its region and its padding must be zero (as PyTorch/XLA pads).
    """
    shape = tuple(expected.shape)
    covered = torch.zeros(shape, dtype=torch.bool)
    for shard in shards:
        region = _region(shard.indices, shape)
        sizes = tuple(len(range(*s.indices(n))) for s, n in zip(region, shape))
        data = shard.data
        inside = data[tuple(slice(0, k) for k in sizes)]
        problem = compare(f"{name} shard on {shard.shard_device} at {list(region)}",
                          inside, expected[region])
        if problem:
            return problem
        padding = data.clone()
        padding[tuple(slice(0, k) for k in sizes)] = 0
        if padding.ne(0).any():
            return f"{name}: shard on {shard.shard_device} has non-zero padding"
        covered[region] = True
    if not covered.all():
        return f"{name}: local_shards leave {(~covered).sum().item()} elements uncovered"
    return None
