"""In-place updates of a marked tensor keep its sharding, constrained once per chain.

A marked tensor keeps its sharding across in-place updates (PyTorch/XLA re-applies it).
A chain of updates (an optimizer's) is constrained where its value leaves the graph or
another op reads it, not after every op: the values and the layouts the program gives
the tensors are the same, with fewer nodes.
"""

import copy

import torch

import torchspmd
from torchspmd.lowering.annotation_ops import SHARDING_CONSTRAINT
from torchspmd.runtime.graph import collect
from torchspmd.sharding import Mesh, get_sharding, mark_sharding


def _mesh() -> Mesh:
    return Mesh(list(range(8)), (4, 2), ("data", "model"))


def _constraints(*tensors) -> int:
    """Sharding constraints in the pending graph of ``tensors``."""
    roots = [t.handle.value()[0] for t in tensors if not t.handle.value()[0].is_leaf]
    return sum(n.sig.op is SHARDING_CONSTRAINT for n in collect(roots).nodes)


def _marked(cpu: torch.Tensor, spec: tuple) -> torch.Tensor:
    t = cpu.to("spmd") + 0  # computed device data, as parameters are after a step
    mark_sharding(t, _mesh(), spec)
    torchspmd.sync()
    return t


def test_a_chain_of_in_place_updates_is_constrained_once_and_keeps_the_layout():
    torch.manual_seed(0)
    w_cpu, a_cpu, b_cpu = torch.randn(8, 6), torch.randn(8, 6), torch.rand(8, 6) + 1
    w = _marked(w_cpu, ("data", "model"))
    layout = get_sharding(w)
    a, b = a_cpu.to("spmd"), b_cpu.to("spmd")
    for t, x, y in ((w_cpu, a_cpu, b_cpu), (w, a, b)):
        t.mul_(0.5)
        t.add_(1)
        t.addcdiv_(x, y, value=0.1)
    assert _constraints(w) == 1
    torchspmd.sync()
    assert get_sharding(w) == layout
    torch.testing.assert_close(w.cpu(), w_cpu)


def test_a_value_read_between_updates_keeps_its_constraint():
    torch.manual_seed(0)
    w_cpu, v_cpu = torch.randn(8, 6), torch.randn(6, 4)
    w = _marked(w_cpu, ("data", None))
    layout = get_sharding(w)
    v = v_cpu.to("spmd")
    results = []
    for t, x in ((w_cpu, v_cpu), (w, v)):
        t.mul_(2)
        results.append(t @ x)  # reads the updated value: it is constrained for this read
        t.add_(1)
    assert _constraints(w, results[1]) == 2
    torchspmd.sync()
    assert get_sharding(w) == layout
    torch.testing.assert_close(results[1].cpu(), results[0])
    torch.testing.assert_close(w.cpu(), w_cpu)


def test_an_optimizer_step_constrains_each_parameter_once():
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    spmd = copy.deepcopy(cpu).to("spmd")
    for p in spmd.parameters():
        mark_sharding(p, _mesh(), ("data",) + (None,) * (p.dim() - 1))
    torchspmd.sync()
    layouts = [get_sharding(p) for p in spmd.parameters()]
    opts = [torch.optim.AdamW(m.parameters(), lr=0.01, weight_decay=0.1) for m in (cpu, spmd)]
    x, y = torch.randn(4, 8), torch.randn(4, 4)
    for step in range(3):
        for model, opt, (xx, yy) in ((cpu, opts[0], (x, y)),
                                     (spmd, opts[1], (x.to("spmd"), y.to("spmd")))):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(xx), yy).backward()
            # Without the step's hooks: the launch after it (``device/step_boundary.py``)
            # would run the graph this test reads.
            type(opt).step.__wrapped__(opt)
        params = list(spmd.parameters())
        # AdamW updates each parameter twice in place (weight decay, then the step).
        assert _constraints(*params) == len(params)
        torchspmd.sync()
    assert [get_sharding(p) for p in spmd.parameters()] == layouts
    for p, q in zip(cpu.parameters(), spmd.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-5, atol=1e-6)
