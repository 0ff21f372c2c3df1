"""Buffer donation on the lazy path: at ``sync()`` (and at reads), state updated in place
gives its old buffer to the program, so a step holds one copy of it, not two. A buffer
that anything else can still read (a ``detach()``, a view, a tensor kept from an earlier
step, a zero-copy ``copy_`` target) is never donated, and keeps its value."""

import gc
import weakref

import jax
import pytest
import torch

import torchspmd
import torchspmd.debug
from torchspmd.runtime import execute


def _donated() -> int:
    return torchspmd.metrics()["donated_bytes"]


def _on_device(values) -> torch.Tensor:
    """A tensor holding device data (a computed value, not host data waiting to upload)."""
    x = torch.tensor(values, dtype=torch.float32, device="spmd") + 0
    torchspmd.sync()
    return x


@pytest.mark.parametrize("optimizer", [
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    lambda ps: torch.optim.AdamW(ps, lr=0.01),
], ids=["sgd", "adamw"])
def test_a_training_step_donates_parameters_and_state_and_matches_cpu(optimizer):
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    spmd = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    spmd.load_state_dict(cpu.state_dict())
    spmd.to("spmd")
    cpu_opt, spmd_opt = optimizer(cpu.parameters()), optimizer(spmd.parameters())
    before = _donated()
    for _ in range(4):
        x, y = torch.randn(4, 8), torch.randn(4, 4)
        for model, opt, (xx, yy) in ((cpu, cpu_opt, (x, y)),
                                     (spmd, spmd_opt, (x.to("spmd"), y.to("spmd")))):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(xx), yy).backward()
            opt.step()
        torchspmd.sync()
    param_bytes = sum(p.numel() * 4 for p in cpu.parameters())
    assert _donated() - before >= 2 * param_bytes  # later steps donate params and state
    for p, q in zip(cpu.parameters(), spmd.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-5, atol=1e-6)


def test_a_tensor_replaced_by_its_update_is_donated():
    x = _on_device([1.0, 2.0])
    before = _donated()
    x = x + 1
    torchspmd.sync()
    assert _donated() - before == 8
    assert x.cpu().tolist() == [2.0, 3.0]


def test_a_tensor_kept_from_an_earlier_step_is_not_donated():
    x = _on_device([1.0, 2.0])
    kept = x
    before = _donated()
    x = x + 1
    torchspmd.sync()
    assert _donated() == before
    assert kept.cpu().tolist() == [1.0, 2.0]
    assert x.cpu().tolist() == [2.0, 3.0]


def test_a_detached_tensor_sees_the_update_of_a_parameter_whose_buffer_is_donated():
    p = _on_device([1.0, 2.0])
    detached = p.detach()
    before = _donated()
    p.add_(1)
    torchspmd.sync()
    # detach shares p's storage and shows its value (no node of its own reads the old
    # buffer), so no one can read the old buffer any more: it is donated.
    assert _donated() - before == 8
    assert detached.cpu().tolist() == [2.0, 3.0]  # detach shares storage: it sees the write
    assert p.cpu().tolist() == [2.0, 3.0]


def test_a_view_taken_before_an_in_place_update_reads_the_new_value():
    p = _on_device([1.0, 2.0, 3.0])
    view = p[1:]
    before = _donated()
    p.mul_(2)
    torchspmd.sync()
    assert _donated() == before  # the view's pending slice still reads the old buffer
    assert view.cpu().tolist() == [4.0, 6.0]
    assert p.cpu().tolist() == [2.0, 4.0, 6.0]


def test_a_zero_copy_copy_target_keeps_its_value():
    source = _on_device([1.0, 2.0])
    target = torch.empty(2, device="spmd")
    target.copy_(source)  # shares source's buffer
    torchspmd.sync()
    before = _donated()
    source.add_(1)
    torchspmd.sync()
    assert _donated() == before
    assert target.cpu().tolist() == [1.0, 2.0]
    assert source.cpu().tolist() == [2.0, 3.0]


def test_a_read_frees_what_the_run_consumed():
    # Freed when sync() returns, the graph's old values would compete with the program
    # for the host's cores; a read waits for the devices anyway, so it frees them first.
    x = _on_device([1.0, 2.0])
    old = weakref.ref(x._h.value()[0].arrays[0])
    x.mul_(2)
    torchspmd.sync()
    assert old() is not None  # the run's graph still holds it
    assert x.cpu().tolist() == [2.0, 4.0]
    assert old() is None


def test_a_read_runs_pending_updates_with_donation():
    x = _on_device([1.0, 2.0])
    before = _donated()
    x.mul_(3)
    assert x.sum().item() == 9.0  # runs the pending update, donating x's old buffer
    assert _donated() - before == 8
    assert x.cpu().tolist() == [3.0, 6.0]


def test_a_graph_that_ran_is_freed_when_the_host_waits_and_never_blocks_donation():
    x = _on_device([1.0, 2.0])
    y = x * 2 + 1
    middle = weakref.ref(y._h.value()[0].inputs[0][0])  # the node of x * 2
    torchspmd.sync()
    # Kept while the program may run (freeing competes with it for the cores)...
    assert middle() is not None
    torchspmd.wait_device_ops()
    assert middle() is None  # ...and freed once the host waits.
    before = _donated()
    for op in (lambda t: t.add_(1), lambda t: t.mul_(2)):
        op(y)
        torchspmd.sync()  # no wait: the next run frees the last graph before it donates
    assert _donated() - before == 16
    assert y.cpu().tolist() == [8.0, 12.0]


def _live_bytes() -> int:
    gc.collect()
    return sum(a.nbytes for a in jax.live_arrays() if not a.is_deleted())


def test_a_lazy_adamw_step_holds_one_copy_of_parameters_and_state():
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64).to("spmd")
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    x = torch.randn(2, 64).to("spmd")
    for _ in range(3):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        torchspmd.sync(wait=True)
    live = _live_bytes()  # parameters, grads, moments, the batch: what the loop keeps
    # XLA's accounting of the step: its arguments and outputs, less the donated ones
    # (outputs written into argument buffers) is what it holds at its peak.
    memory = execute.last_program().memory_analysis()
    donated = 3 * sum(p.numel() * 4 for p in model.parameters())  # params, 2 moments
    assert memory.alias_size_in_bytes >= donated
    peak = (memory.argument_size_in_bytes + memory.output_size_in_bytes
            - memory.alias_size_in_bytes)
    # One copy of the state, plus the step's small outputs and scalars (the loss, the
    # learning rate); without donation it would be live + donated.
    assert peak < live + donated // 10


def test_each_donated_buffer_goes_to_its_own_tensors_new_value():
    # Same-shaped parameters, moments and gradients: JAX gives a donated buffer to the
    # first output of its shape, so the program lists each donated input's own new value
    # first. Paired by graph order, a parameter's buffer went to another's new value
    # while still to be read, and XLA copied all 24 donated inputs here first.
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(4)]).to("spmd")
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(8, 16).to("spmd")).square().mean().backward()
        opt.step()
        torchspmd.sync()
    donated = 3 * len(list(model.parameters()))
    assert torchspmd.debug.copied_arguments() <= donated // 4


def test_a_sub_mesh_copy_that_lends_the_buffers_keeps_its_value():
    from torchspmd.sharding.api import mark_sharding
    from torchspmd.sharding.mesh import Mesh

    source = _on_device([1.0, 2.0, 3.0, 4.0])  # replicated on every device
    target = torch.empty(4, device="spmd")
    target.copy_(source)
    mark_sharding(target, Mesh([0, 1], (2,), ("x",)), (None,))  # lends source's buffers
    torchspmd.sync()
    before = _donated()
    source.add_(1)
    torchspmd.sync()
    assert _donated() == before
    assert target.cpu().tolist() == [1.0, 2.0, 3.0, 4.0]
    assert source.cpu().tolist() == [2.0, 3.0, 4.0, 5.0]
