"""visualize_sharding: rich tables like PyTorch/XLA's (test_spmd_debugging.py style)."""

import io

import numpy as np
import pytest
import rich.align
import rich.box
import rich.console
import rich.padding
import rich.style
import rich.table

import torchspmd.jax_setup  # noqa: F401

from torchspmd.debug.visualize import sharding_grid, visualize_sharding
from torchspmd.sharding.hlo_text import spec_to_hlo_text
from torchspmd.sharding.partition_spec import resolve
from torchspmd.sharding.mesh import Mesh


def render(table: rich.table.Table) -> str:
    console = rich.console.Console(file=io.StringIO(), width=120)
    console.print(table)
    return console.file.getvalue()


def expected_table(rows: list[list[str]]) -> rich.table.Table:
    """The table PyTorch/XLA's tests build by hand."""
    use_color = rich.console.Console().color_system is not None
    table = rich.table.Table(
        show_header=False,
        show_lines=not use_color,
        padding=0,
        highlight=not use_color,
        pad_edge=False,
        box=rich.box.SQUARE if not use_color else None,
    )
    for row in rows:
        table.add_row(*[
            rich.padding.Padding(
                rich.align.Align(text, "center", vertical="middle"),
                (1, 1, 1, 1),
                style=rich.style.Style(bgcolor=None, color=None),
            )
            for text in row
        ])
    return table


def spec_string(shape, spec):
    return spec_to_hlo_text(resolve(Mesh(np.arange(8), shape), spec, len(spec)))


def test_tiled_2d_draws_one_cell_per_device(capsys):
    table = visualize_sharding(spec_string((2, 4), (0, 1)))
    rows = [[f"CPU {i}" for i in range(4)], [f"CPU {i}" for i in range(4, 8)]]
    assert render(table) == render(expected_table(rows))


def test_tiled_over_a_reversed_mesh_shows_real_ids(capsys):
    table = visualize_sharding("{devices=[1,8]7,6,5,4,3,2,1,0}")
    assert render(table) == render(expected_table([[f"CPU {i}" for i in range(7, -1, -1)]]))


def test_partial_replication_draws_replica_groups(capsys):
    table = visualize_sharding(spec_string((2, 4), (0, None)))
    assert render(table) == render(expected_table([["CPU [0, 1, 2, 3]"], ["CPU [4, 5, 6, 7]"]]))


def test_replicated_is_one_cell_with_every_device(capsys):
    table = visualize_sharding("{replicated}")
    assert render(table) == render(expected_table([["CPU [0, 1, 2, 3, 4, 5, 6, 7]"]]))


def test_unannotated_is_drawn_as_replicated(capsys):
    assert render(visualize_sharding("")) == render(visualize_sharding("{replicated}"))


def test_v2_strings_are_converted(capsys):
    v2 = "{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}"
    v1 = "{devices=[1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"
    assert render(visualize_sharding(v2)) == render(visualize_sharding(v1))


def test_table_is_printed_to_the_console(capsys):
    visualize_sharding("{devices=[1,2]0,1}")
    assert "CPU 1" in capsys.readouterr().out


def test_one_dim_tiling_is_one_row():
    assert sharding_grid("{devices=[4]3,2,1,0}") == [[[3], [2], [1], [0]]]


def test_tile_counts_above_nine_are_read_whole():
    grid = sharding_grid("{devices=[1,2,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}")
    assert grid == [[[0, 2, 4, 6], [1, 3, 5, 7]]]


def test_higher_rank_cells_gather_the_devices_of_their_first_two_coords():
    assert sharding_grid("{devices=[2,1,2]0,1,2,3}") == [[[0, 1]], [[2, 3]]]


def test_partial_over_a_3d_tensor_groups_by_first_two_dims():
    assert sharding_grid(spec_string((2, 1, 4), (1, None, 0))) == [[list(range(8))]]


@pytest.mark.parametrize("bad", ["{devices=[2]0,1", "garbage", "{manual}"])
def test_malformed_strings_are_value_errors(bad):
    """One readable message naming the string (it was a tuple of three pieces)."""
    with pytest.raises(ValueError, match=r"^sharding \S+.* is not organized as expected"):
        visualize_sharding(bad)


def test_returns_a_rich_table(capsys):
    table = visualize_sharding(spec_string((2, 4), (0, 1)))
    assert isinstance(table, rich.table.Table) and table.row_count == 2 and len(table.columns) == 4
