"""A host read (``.item()``, ``.cpu()``, printing) runs all pending work, not only what it reads.

So a loop that reads a value every iteration starts each iteration from data: it compiles
a fixed number of graphs and never runs an earlier iteration's work again.
"""

import torch

import torchspmd


def test_a_loop_that_reads_every_iteration_compiles_at_most_two_graphs():
    torchspmd.sync()
    torchspmd.reset_metrics()
    x, expected = torch.ones(4, device="spmd"), torch.ones(4)
    for _ in range(8):
        x, expected = x * 2, expected * 2
        assert x.sum().item() == expected.sum().item()
    assert torchspmd.metrics()["graphs_compiled"] <= 2


def test_a_loop_that_reads_every_iteration_runs_each_op_once():
    torchspmd.sync()
    torchspmd.reset_metrics()
    x = torch.ones(4, device="spmd")
    for _ in range(8):
        x = x * 2
        x.sum().item()
    m = torchspmd.metrics()
    assert m["ops_rerun"] == 0


def test_a_read_leaves_no_other_work_pending():
    unrelated = torch.randn(3, device="spmd") + 1
    torch.ones(2, device="spmd").sum().item()
    before = torchspmd.metrics()["executions"]
    torchspmd.sync()
    assert torchspmd.metrics()["executions"] == before
    assert unrelated.shape == (3,)


def test_reading_a_temporary_sees_values_from_before_a_later_in_place_update():
    p_cpu = torch.arange(4.0)
    p = p_cpu.to("spmd")
    total = p.sum()  # a temporary: only the read wants it
    p.add_(1)
    assert total.item() == p_cpu.sum().item()
    torch.testing.assert_close(p.cpu(), p_cpu + 1)
