"""scan_layers: a homogeneous stack through lax.scan, equal to the Python loop on CPU."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchspmd
from torchspmd import Mesh, get_sharding, mark_sharding, scan_layers
from torchspmd.testing.models import Block


class Residual(nn.Module):
    def __init__(self, dim: int = 16):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(dim), nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


def layers(cls=Residual, n: int = 3, **kwargs) -> nn.ModuleList:
    torch.manual_seed(0)
    return nn.ModuleList(cls(**kwargs) for _ in range(n))


def loop(stack, x):
    for layer in stack:
        x = layer(x)
    return x


@pytest.mark.parametrize("checkpoint", [True, False])
def test_forward_and_every_layers_gradients_match_the_loop_on_cpu(checkpoint):
    cpu = layers()
    spmd = copy.deepcopy(cpu).to("spmd")
    x = torch.randn(4, 5, 16)
    expected = loop(cpu, x)
    expected.square().mean().backward()
    out = scan_layers(spmd, x.to("spmd"), checkpoint=checkpoint)
    out.square().mean().backward()
    torch.testing.assert_close(out.cpu(), expected.detach())
    for (name, p), q in zip(cpu.named_parameters(), spmd.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, msg=name)


@pytest.mark.parametrize("checkpoint", [True, False])
def test_second_derivatives_match_the_loop_on_cpu(checkpoint):
    # create_graph=True differentiates the scan's gradient and each layer's row of it.
    cpu = layers(n=2, dim=8)
    spmd = copy.deepcopy(cpu).to("spmd")
    x = torch.randn(4, 8)
    for stack, out in ((cpu, loop(cpu, x)), (spmd, scan_layers(spmd, x.to("spmd"),
                                                                checkpoint=checkpoint))):
        grads = torch.autograd.grad(out.square().sum(), list(stack.parameters()),
                                    create_graph=True)
        sum(g.square().sum() for g in grads).backward()
    # These gradients reach ~2e3 and their small elements are differences of such terms:
    # float32 rounds them to ~1e-4 absolute whatever the order of the sums, so the
    # absolute tolerance scales with each gradient's largest element (~8 of its ulps).
    for (name, p), q in zip(cpu.named_parameters(), spmd.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-4,
                                   atol=1e-6 * p.grad.abs().max().item(), msg=name)


def test_transformer_blocks_train_like_the_loop():
    cpu = layers(Block, n=2, dim=16, heads=2)
    spmd = copy.deepcopy(cpu).to("spmd")
    opt_cpu = torch.optim.SGD(cpu.parameters(), lr=0.1)
    opt_spmd = torch.optim.SGD(spmd.parameters(), lr=0.1)
    for step in range(2):
        x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(step))
        loss_cpu = loop(cpu, x).square().mean()
        loss_spmd = scan_layers(spmd, x.to("spmd")).square().mean()
        for loss, opt in ((loss_cpu, opt_cpu), (loss_spmd, opt_spmd)):
            loss.backward()
            opt.step()
            opt.zero_grad()
        torch.testing.assert_close(loss_spmd.cpu(), loss_cpu.detach())
    for p, q in zip(cpu.parameters(), spmd.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach())


def test_every_step_after_the_first_reuses_the_compiled_program():
    spmd = layers().to("spmd")
    x = torch.randn(4, 16)
    for _ in range(2):  # the first step's parameters are host data, the second's device data
        scan_layers(spmd, x.to("spmd")).sum().backward()
        torchspmd.sync()  # runs the step (the gradients are live)
        spmd.zero_grad()  # the next steps then record the very same graph
    before = [torchspmd.metrics()[k] for k in ("graphs_compiled", "executions")]
    for _ in range(2):
        scan_layers(spmd, x.to("spmd")).sum().backward()
        torchspmd.sync()
        spmd.zero_grad()
    after = [torchspmd.metrics()[k] for k in ("graphs_compiled", "executions")]
    assert after[0] == before[0] and after[1] >= before[1] + 2


def test_the_layer_is_replayed_into_jax_once_per_compiled_program():
    # Not per layer, and not again for the gradient: the backward reuses the forward's
    # trace (its residuals, or its checkpoint); a step reusing a program replays nothing.
    spmd = layers(n=4).to("spmd")
    x = torch.randn(4, 16).to("spmd")

    def step(loss):
        loss(scan_layers(spmd, x)).backward()
        torchspmd.sync()  # runs the step: the gradients are live
        spmd.zero_grad()

    def counts():
        return [torchspmd.metrics()[k] for k in ("scan_body_traces", "graphs_compiled")]

    step(torch.sum)  # the scan's shape inference (one replay) happens here, once
    before = counts()
    step(lambda h: h.square().sum())  # same scan op, a new program around it
    after = counts()
    assert after[1] - before[1] == 1 and after[0] - before[0] == 1
    step(lambda h: h.square().sum())
    assert counts() == after


def test_stacked_parameters_are_sharded_as_the_layers_were():
    mesh = Mesh(np.arange(8), (2, 4), ("data", "model"))
    cpu = layers()
    spmd = copy.deepcopy(cpu).to("spmd")
    for layer in spmd:
        mark_sharding(layer.up.weight, mesh, ("model", None))
        mark_sharding(layer.down.weight, mesh, (None, "model"))
    x = torch.randn(8, 16)
    xs = x.to("spmd")
    mark_sharding(xs, mesh, ("data", None))
    out = scan_layers(spmd, xs)
    out.sum().backward()
    torch.testing.assert_close(out.cpu(), loop(cpu, x).detach())
    torchspmd.sync()
    assert get_sharding(spmd[1].up.weight.grad) == get_sharding(spmd[1].up.weight)


def test_layers_of_different_shapes_are_refused():
    stack = nn.ModuleList([Residual(16), Residual(8)]).to("spmd")
    with pytest.raises(ValueError, match="identical layers; layer 1"):
        scan_layers(stack, torch.randn(2, 16).to("spmd"))


def test_a_layer_changing_the_hidden_shape_is_refused():
    stack = nn.ModuleList([nn.Linear(16, 8), nn.Linear(16, 8)]).to("spmd")
    with pytest.raises(ValueError, match="one tensor of its input's shape"):
        scan_layers(stack, torch.randn(2, 16).to("spmd"))


def test_dropout_in_a_scanned_layer_is_refused_with_the_fix():
    stack = nn.ModuleList([nn.Dropout(0.5), nn.Dropout(0.5)]).to("spmd")
    with pytest.raises(NotImplementedError, match=r"random numbers.*p=0 or model.eval\(\)"):
        scan_layers(stack, torch.randn(2, 16).to("spmd"))


def test_buffer_updates_in_a_scanned_layer_are_refused():
    stack = nn.ModuleList([nn.BatchNorm1d(16), nn.BatchNorm1d(16)]).to("spmd")
    with pytest.raises(NotImplementedError, match="modified in place"):
        scan_layers(stack, torch.randn(4, 16).to("spmd"))


def test_each_layers_gradient_is_a_row_taken_at_an_index_that_is_program_data():
    # XLA:CPU compiles one kernel per distinct fusion: a row index baked in as a constant
    # made every layer's optimizer update a kernel of its own (see layer_stack.py).
    from torchspmd.parallel.layer_stack import ROW

    cpu = layers()
    spmd = copy.deepcopy(cpu).to("spmd")
    x = torch.randn(4, 16)
    scan_layers(spmd, x.to("spmd")).sum().backward()
    loop(cpu, x).sum().backward()
    for i, layer in enumerate(spmd):
        node, _ = layer.up.weight.grad.handle.value()
        while node.sig.op is torch.ops.aten.detach.default:  # autograd's accumulation
            node, _ = node.inputs[0]
        assert node.sig.op is ROW
        index = node.inputs[1][0]
        assert index.is_leaf and int(index.host) == i
    for i, layer in enumerate(spmd):  # reading a value runs the step: checked after
        torch.testing.assert_close(layer.up.weight.grad.cpu(), cpu[i].up.weight.grad)


def test_a_compiled_step_with_scanned_layers_trains_like_the_loop_on_cpu():
    # The gradient's row indices are host scalars made during backward: a captured step
    # must replay them as the same rows every call.
    cpu = layers(n=3, dim=8)
    spmd = copy.deepcopy(cpu).to("spmd")
    opt_cpu = torch.optim.SGD(cpu.parameters(), lr=0.1)
    opt_spmd = torch.optim.SGD(spmd.parameters(), lr=0.1)

    @torchspmd.compile
    def step(x):
        loss = scan_layers(spmd, x).square().mean()
        loss.backward()
        opt_spmd.step()
        opt_spmd.zero_grad()
        return loss

    replays = torchspmd.metrics()["step_replays"]
    for i in range(3):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(i))
        expected = loop(cpu, x).square().mean()
        expected.backward()
        opt_cpu.step()
        opt_cpu.zero_grad()
        torch.testing.assert_close(step(x.to("spmd")).detach().cpu(), expected.detach())
    assert torchspmd.metrics()["step_replays"] - replays >= 1
    for p, q in zip(cpu.parameters(), spmd.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach())


class ReadsOnTheHost(Residual):
    def forward(self, x):
        if float(x.abs().max()) < 0:  # a host read: a traced layer has no values
            raise AssertionError
        return super().forward(x)


def test_a_layer_that_reads_on_the_host_fails_clearly_and_leaves_nothing_pending():
    stack = layers(ReadsOnTheHost).to("spmd")
    x = torch.randn(4, 5, 16)
    with pytest.raises(RuntimeError, match="a value was read .* while a function was being traced") as error:
        scan_layers(stack, x.to("spmd"))
    # Later work syncs and runs, even while the error (and, through its traceback, the
    # traced values) is still alive: nothing of the failed trace is left to compute.
    y = x.to("spmd") * 2
    torchspmd.sync()
    assert torch.equal(y.cpu(), x * 2)
    assert error.value.__traceback__ is not None


def test_a_host_read_refused_inside_a_compiled_step_leaves_nothing_pending():
    """In a compiled step the read is refused before anything runs, so the trace's values
    were never computed: they must not be left for the next sync() either."""
    stack = layers(ReadsOnTheHost).to("spmd")
    x = torch.randn(4, 5, 16)
    step = torchspmd.compile(lambda h: scan_layers(stack, h))
    with pytest.raises(torchspmd.step.HostReadInStep) as error:
        step(x.to("spmd"))
    y = x.to("spmd") * 2
    torchspmd.sync()
    assert torch.equal(y.cpu(), x * 2)
    assert error.value.__traceback__ is not None


class Gathers(Residual):
    """Reads columns of its input by an index it computes, below ``limit`` (out of range
    past 16)."""

    def __init__(self, limit: int = 16):
        super().__init__()
        self.limit = limit

    def forward(self, x):
        index = (x.abs().sum(-1).flatten() * 100).long() % self.limit
        return super().forward(x) + x.flatten(0, -2).index_select(1, index[:16]).sum()


def test_an_index_out_of_range_in_a_scanned_layer_raises_as_the_loop_does():
    stack = layers(Gathers, limit=40)
    x = torch.randn(4, 5, 16)
    with pytest.raises((IndexError, RuntimeError)):
        loop(stack, x)  # CPU: index_select's index past 16 columns
    with pytest.raises(IndexError, match="aten.index_select: index out of range"):
        scan_layers(copy.deepcopy(stack).to("spmd"), x.to("spmd")).cpu()


def test_indices_in_range_in_a_scanned_layer_give_the_loops_values_and_gradients():
    cpu = layers(Gathers)
    spmd = copy.deepcopy(cpu).to("spmd")
    x = torch.randn(4, 5, 16)
    expected = loop(cpu, x)
    out = scan_layers(spmd, x.to("spmd"))
    # (the gathered sums grow to ~1e5: float32 rounding, summed in another order)
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-3, atol=1e-3)
    (expected / expected.abs().max()).sum().backward()
    (out / out.abs().max()).sum().backward()
    for a, b in zip(cpu.parameters(), spmd.parameters()):
        torch.testing.assert_close(b.grad.cpu(), a.grad, rtol=1e-3, atol=1e-4)
