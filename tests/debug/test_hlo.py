"""debug: the last graph's optimized HLO, its collectives, tensor pictures, the metrics table."""

import numpy as np
import rich.table
import torch

import torchspmd
from torchspmd.debug import (collectives, copied_arguments, last_hlo, metrics_report,
                             visualize_tensor_sharding)
from torchspmd.debug.hlo import COLLECTIVES
from torchspmd.sharding import Mesh, mark_sharding

SYNTHETIC = """
ENTRY %main (p: f32[2,4]) -> f32[8,4] {
  %p = f32[2,4]{1,0} parameter(0), sharding={devices=[4,1]0,1,2,3}
  %ag = f32[8,4]{1,0} all-gather(f32[2,4]{1,0} %p), channel_id=1, dimensions={0}
  %ags = (f32[2,4]{1,0}, f32[8,4]{1,0}) all-gather-start(f32[2,4]{1,0} %p), dimensions={0}
  %agd = f32[8,4]{1,0} all-gather-done((f32[2,4]{1,0}, f32[8,4]{1,0}) %ags)
  %ar = f32[8,4]{1,0} all-reduce(f32[8,4]{1,0} %ag), to_apply=%add
  %rs = f32[2,4]{1,0} reduce-scatter(f32[8,4]{1,0} %ar), dimensions={0}, to_apply=%add
  %a2a = f32[2,4]{1,0} all-to-all(f32[2,4]{1,0} %rs), dimensions={1}
  %cps = (f32[2,4]{1,0}, f32[2,4]{1,0}) collective-permute-start(f32[2,4]{1,0} %a2a)
  %cpd = f32[2,4]{1,0} collective-permute-done((f32[2,4]{1,0}, f32[2,4]{1,0}) %cps)
  %f = f32[2,4]{1,0} fusion(%cpd), kind=kLoop, calls=%all-reduce.fused, metadata={op_name="all-gather"}
  ROOT %out = f32[8,4]{1,0} add(%agd, %ag)
}
"""


def test_collectives_counts_each_kind_once_per_instruction():
    assert collectives(SYNTHETIC) == {"all-gather": 2, "all-reduce": 1, "reduce-scatter": 1,
                                      "all-to-all": 1, "collective-permute": 1}


def test_collectives_of_text_without_any():
    assert collectives("%a = f32[2]{0} add(f32[2]{0} %x, f32[2]{0} %y)") == dict.fromkeys(
        COLLECTIVES, 0)


def test_copied_arguments_counts_copies_of_arguments_only():
    text = """
ENTRY %main (p: f32[4], q: f32[4]) -> (f32[4], f32[4], f32[4]) {
  %p = f32[4]{0} parameter(0)
  %q.1 = f32[4]{0} parameter(1)
  %c = f32[4]{0} copy(%p)
  %d = f32[4]{0} copy(f32[4]{0} %q.1)
  %sum = f32[4]{0} add(%p, %q.1)
  %e = f32[4]{0} copy(%sum)
  ROOT %t = (f32[4]{0}, f32[4]{0}, f32[4]{0}) tuple(%c, %d, %e)
}
"""
    assert copied_arguments(text) == 2


def test_last_hlo_is_the_partitioned_program():
    (torch.randn(8, 8).to("spmd") * 2).cpu()
    text = last_hlo()
    assert "ENTRY" in text and "num_partitions=8" in text


def test_sharded_contraction_needs_an_all_reduce():
    a_cpu, b_cpu = torch.randn(8, 16), torch.randn(16, 8)
    mesh = Mesh(np.arange(8), (1, 8))
    a, b = a_cpu.to("spmd"), b_cpu.to("spmd")
    mark_sharding(a, mesh, (None, 1))  # the contracting dim is split over 8 devices
    mark_sharding(b, mesh, (1, None))
    c = a @ b
    torchspmd.sync()
    assert collectives()["all-reduce"] >= 1
    torch.testing.assert_close(c.cpu(), a_cpu @ b_cpu, rtol=1e-4, atol=1e-4)


def test_visualize_tensor_sharding_draws_the_tensor_layout():
    x = torch.randn(8, 8).to("spmd")
    mark_sharding(x, Mesh(np.arange(8), (2, 4)), (0, 1))
    table = visualize_tensor_sharding(x, use_color=False)
    assert isinstance(table, rich.table.Table)
    assert table.row_count == 2 and len(table.columns) == 4


def test_metrics_report_lists_every_counter():
    table = metrics_report(print_table=False)
    assert table.row_count == len(torchspmd.metrics())
