"""Draw a sharding string as a ``rich`` table, like PyTorch/XLA's ``visualize_sharding``.

The table shows the first two tile dims: one cell per tile, holding ``"CPU 3"`` for a
single device or ``"CPU [0, 1]"`` for the devices that share the tile. A 1-d tiling is
one row. Where PyTorch/XLA mis-reads strings (tile counts above 9, ranks above 2) this
module reads them properly: a cell lists every device whose tile has that coordinate
in the first two dims.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import rich.align
import rich.box
import rich.console
import rich.padding
import rich.style
import rich.table

import torchspmd.jax_setup  # noqa: F401
import jax

from torchspmd.sharding.hlo_text import ParsedSharding, ShardingType, parse_hlo_text

__all__ = ["visualize_sharding", "sharding_grid"]


def _device_kind() -> str:
    return jax.devices()[0].platform.upper()


def sharding_grid(sharding: str) -> list[list[list[int]]]:
    """Devices of each cell of the drawn grid (rows x cols x devices).

    ``{replicated}`` and ``''`` are one cell holding every device.

    >>> sharding_grid("{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}")
    [[[0, 1]], [[2, 3]]]
    """
    return _grid_and_kind(sharding)[0]


def _grid_and_kind(sharding: str) -> tuple[list[list[list[int]]], ShardingType]:
    if sharding in ("", "{replicated}"):
        return [[list(range(len(jax.devices())))]], ShardingType.REPLICATED
    parsed = _parse(sharding)
    tiles = parsed.data_tile_dims
    rows, cols = (tiles[0], tiles[1]) if len(tiles) >= 2 else (1, tiles[0] if tiles else 1)
    # Axes: (row, col, everything else) so each cell is a contiguous run of ids.
    ids = np.asarray(parsed.device_ids).reshape(rows, cols, -1)
    grid = [[ids[r, c].tolist() for c in range(cols)] for r in range(rows)]
    return grid, parsed.kind


def _parse(sharding: str) -> ParsedSharding:
    try:
        parsed = parse_hlo_text(sharding)
    except ValueError as e:
        raise ValueError(f"sharding {sharding} is not organized as expected ({e}): pass "
                         "the HLO text get_sharding gives, e.g. '{devices=[2,2]0,1,2,3}'") from e
    if parsed.kind not in (ShardingType.TILED, ShardingType.PARTIAL):
        raise ValueError(f"sharding {sharding} is not organized as expected: a picture needs "
                         f"a tiled or partially replicated sharding, not {parsed.kind.name}")
    return parsed


def _cell_text(kind: str, devices: Sequence[int], tiled: bool) -> str:
    # PyTorch/XLA prints a lone id for a tile, a list for a replica group.
    if tiled and len(devices) == 1:
        return f"{kind} {devices[0]}"
    return f"{kind} {list(devices)}"


def _cell(text: str) -> rich.padding.Padding:
    # Fixed (1, 1, 1, 1) padding and no colors, as in PyTorch/XLA today.
    return rich.padding.Padding(
        rich.align.Align(text, "center", vertical="middle"),
        (1, 1, 1, 1),
        style=rich.style.Style(bgcolor=None, color=None),
    )


def visualize_sharding(
    sharding: str,
    use_color: bool = True,
    scale: float = 1.0,
    min_width: int = 9,
    max_width: int = 80,
) -> rich.table.Table:
    """Print the sharding as a table of devices (first two tile dims) and return it.

    Accepts V1 and V2 strings. ``use_color`` only matters when the console has colors:
    cells are then separated by color-less spacing rather than box lines, as in
    PyTorch/XLA; ``max_width`` is the console width. ``scale`` and ``min_width`` are
    accepted for compatibility: PyTorch/XLA no longer uses them either.

    >>> table = visualize_sharding("{devices=[2,4]0,1,2,3,4,5,6,7}")  # doctest: +SKIP
    """
    grid, sharding_kind = _grid_and_kind(sharding)
    console = rich.console.Console(width=max_width)
    use_color = use_color and console.color_system is not None
    table = rich.table.Table(
        show_header=False,
        show_lines=not use_color,
        padding=0,
        highlight=not use_color,
        pad_edge=False,
        box=rich.box.SQUARE if not use_color else None,
    )
    kind = _device_kind()
    tiled = sharding_kind is ShardingType.TILED
    for row in grid:
        table.add_row(*[_cell(_cell_text(kind, devices, tiled)) for devices in row])
    console.print(table, end="\n\n")
    return table
