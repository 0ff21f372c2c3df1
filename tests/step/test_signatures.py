"""The cache of a compiled step: per argument signature, reused when a signature recurs."""

import numpy as np
import torch

import torchspmd as xs
from tests.step.helpers import DEVICE, batches, cpu_losses, mlp, on_device, train_step


def _counts():
    m = xs.metrics()
    return m["step_captures"], m["step_replays"], m["graphs_compiled"]


def test_a_new_shape_captures_again_and_an_old_one_replays():
    model = mlp(DEVICE)
    step = xs.compile(train_step(model, torch.optim.SGD(model.parameters(), lr=0.1)))
    (x, y), = batches(1)
    step(*on_device(x, y))  # warm-up (p.grad appears)
    step(*on_device(x, y))  # capture for batch 16
    step(*on_device(x[:8], y[:8]))  # capture for batch 8
    captures, replays, compiled = _counts()
    loss16 = step(*on_device(x, y))
    loss8 = step(*on_device(x[:8], y[:8]))
    assert _counts() == (captures, replays + 2, compiled)
    assert step.plans == 2
    assert loss16.shape == loss8.shape == ()


def test_a_recaptured_identical_graph_reuses_its_compiled_program():
    model = mlp(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = xs.compile(train_step(model, opt))
    data = batches(4)
    for x, y in data[:2]:
        step(*on_device(x, y))
    opt.param_groups[0]["lr"] = 0.05  # a Python float: the step runs its Python again
    captures, _, compiled = _counts()
    step(*on_device(*data[2]))
    assert xs.metrics()["step_captures"] == captures + 1
    assert xs.metrics()["graphs_compiled"] == compiled


def test_an_argument_marked_inside_the_step_keeps_replaying_without_recompiling():
    mesh = xs.Mesh(np.arange(8), (8,), ("data",))
    w = torch.ones(4, 4).to(DEVICE)

    @xs.compile
    def step(x):
        xs.mark_sharding(x, mesh, ("data", None))
        return (x @ w).sum(dim=1)

    xs_ = [torch.randn(8, 4) for _ in range(4)]
    outs = [step(x.to(DEVICE)) for x in xs_[:2]]
    compiled = xs.metrics()["graphs_compiled"]
    outs += [step(x.to(DEVICE)) for x in xs_[2:]]
    assert xs.metrics()["graphs_compiled"] == compiled
    for x, out in zip(xs_, outs):
        torch.testing.assert_close(out.cpu(), (x @ torch.ones(4, 4)).sum(dim=1))


def test_arguments_in_another_layout_are_another_signature():
    mesh = xs.Mesh(np.arange(8), (8,), ("data",))

    @xs.compile
    def double(x):
        return x * 2

    plain = torch.arange(16.0).reshape(8, 2).to(DEVICE)
    sharded = torch.arange(16.0).reshape(8, 2).to(DEVICE)
    xs.mark_sharding(sharded, mesh, ("data", None))
    xs.sync()
    torch.testing.assert_close(double(plain).cpu(), torch.arange(16.0).reshape(8, 2) * 2)
    torch.testing.assert_close(double(sharded).cpu(), torch.arange(16.0).reshape(8, 2) * 2)
    assert double.plans == 2


def test_nested_results_come_back_in_their_structure():
    w = torch.arange(6.0).reshape(2, 3).to(DEVICE)

    @xs.compile
    def stats(x, scale):
        y = x @ w * scale
        return {"sum": y.sum(), "parts": (y.max(), [y.min(), "label"])}

    for _ in range(2):
        out = stats(torch.ones(4, 2).to(DEVICE), 2.0)
    expected = torch.ones(4, 2) @ torch.arange(6.0).reshape(2, 3) * 2
    assert out["parts"][1][1] == "label"
    torch.testing.assert_close(out["sum"].cpu(), expected.sum())
    torch.testing.assert_close(out["parts"][0].cpu(), expected.max())
    torch.testing.assert_close(out["parts"][1][0].cpu(), expected.min())
    assert xs.metrics()["step_replays"] >= 1


def test_results_in_dataclasses_and_mappings_replay_with_each_calls_values():
    """A training step returning its metrics in a dataclass, a ``BatchEncoding`` or a
    ``UserDict`` captured again on every call (their tensors looked like hidden state);
    they are opened like the arguments, so calls replay and each returns its own values,
    in its own types."""
    import collections
    import dataclasses

    from transformers import BatchEncoding

    @dataclasses.dataclass
    class Metrics:
        loss: torch.Tensor
        steps: int

    model = mlp(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    @xs.compile
    def step(x, y):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return Metrics(loss, 1), BatchEncoding({"twice": loss * 2}), collections.UserDict(l=loss)

    data = batches(4)
    expected, _ = cpu_losses(lambda p: torch.optim.SGD(p, lr=0.1), data)
    xs.reset_metrics()
    for (x, y), loss in zip(data, expected):
        metrics, encoding, user = step(*on_device(x, y))
        assert type(metrics) is Metrics and metrics.steps == 1
        assert type(encoding) is BatchEncoding and type(user) is collections.UserDict
        torch.testing.assert_close(metrics.loss.item(), loss, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(encoding["twice"].item(), 2 * loss, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(user["l"].item(), loss, rtol=1e-5, atol=1e-6)
    assert xs.metrics()["step_replays"] >= 2 and xs.metrics()["step_hidden_state"] == 0


def test_an_argument_updated_in_place_is_updated_for_the_caller():
    @xs.compile
    def scale_(x):
        x.mul_(3)

    tensors = [torch.full((2,), float(i)).to(DEVICE) for i in range(3)]
    for t in tensors:
        scale_(t)
    for i, t in enumerate(tensors):
        torch.testing.assert_close(t.cpu(), torch.full((2,), 3.0 * i))


def _host_tensor_marked(mesh, spec):
    t = torch.randn(8, 8).to(DEVICE)  # host data until first used
    xs.mark_sharding(t, mesh, spec)
    return t


def test_a_host_tensors_signature_holds_its_sharding_by_value():
    # Keyed by value, not by id(): an id is reused once its sharding is collected, and a
    # stale plan must never match another sharding that happens to get it.
    from torchspmd.step.signature import signature

    mesh = xs.Mesh(np.arange(8), (8,), ("a",))
    a = _host_tensor_marked(mesh, ("a", None))
    same = _host_tensor_marked(xs.Mesh(np.arange(8), (8,), ("a",)), ("a", None))
    other = _host_tensor_marked(mesh, (None, "a"))
    assert a._h.value()[0].host is not None  # the case keyed by the leaf's own sharding
    key_a, _ = signature((a,), {}, None)
    key_same, _ = signature((same,), {}, None)
    key_other, _ = signature((other,), {}, None)
    assert a._h.value()[0].sharding is not same._h.value()[0].sharding
    assert key_a == key_same and hash(key_a) == hash(key_same)
    assert key_a != key_other


def test_autocast_around_a_call_is_part_of_its_signature():
    """Captured outside autocast, a call inside it runs the autocast ops (bfloat16), as
    PyTorch does; the next call outside replays the float32 program again."""
    model = mlp(DEVICE)
    step = xs.compile(lambda x: model(x))
    (x, _), = batches(1)
    for _ in range(2):
        assert step(x.to(DEVICE)).dtype == torch.float32
    with torch.autocast("spmd", dtype=torch.bfloat16):
        inside = step(x.to(DEVICE))
    assert inside.dtype == torch.bfloat16
    cpu = mlp("cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = cpu(x)
    torch.testing.assert_close(inside.cpu().float(), expected.float(), rtol=2e-2, atol=2e-2)
    assert step(x.to(DEVICE)).dtype == torch.float32


def test_a_hugging_face_batch_encoding_argument_replays_with_its_tensors():
    """``step(batch)`` with a tokenizer's ``BatchEncoding`` (a ``UserDict``) was refused as
    unhashable; its tensors are the step's inputs now, and a write into one of them (a
    view of a larger tensor here) reaches the caller."""
    from transformers import BatchEncoding

    @xs.compile
    def step(batch):
        batch["input_ids"].add_(1)
        return batch["input_ids"] * batch["scale"]

    xs.reset_metrics()
    for i in range(3):
        base = torch.full((4,), float(i)).to(DEVICE)
        out = step(BatchEncoding({"input_ids": base[1:3], "scale": 2.0}))
        assert out.cpu().tolist() == [2.0 * (i + 1)] * 2
        assert base.cpu().tolist() == [i, i + 1, i + 1, i]
    assert xs.metrics()["step_captures"] == 1


class _Trainer:
    def __init__(self, device, seed: int):
        self.model = mlp(device, seed)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def step(self, x, y):
        self.opt.zero_grad()
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        loss.backward()
        self.opt.step()
        return loss

    compiled_step = xs.compile(step)


def test_a_compiled_method_binds_its_instance_and_each_instance_trains_as_on_cpu():
    """``@torchspmd.compile`` on a method: ``trainer.step(x, y)`` was called without
    ``trainer`` (a ``TypeError``). Two instances replay, each with its own model."""
    cpu = [_Trainer("cpu", seed) for seed in (0, 1)]
    dev = [_Trainer(DEVICE, seed) for seed in (0, 1)]
    for x, y in batches(4):
        for c, d in zip(cpu, dev):
            expected = c.step(x, y).item()
            torch.testing.assert_close(d.compiled_step(*on_device(x, y)).item(), expected,
                                       rtol=1e-5, atol=1e-6)
    for c, d in zip(cpu, dev):
        for a, b in zip(c.model.parameters(), d.model.parameters()):
            torch.testing.assert_close(b.detach().cpu(), a.detach(), rtol=1e-5, atol=1e-6)
    assert _Trainer.compiled_step is _Trainer.__dict__["compiled_step"]


def test_a_partial_binding_the_model_and_optimizer_replays_as_on_cpu():
    """``torchspmd.compile(functools.partial(step, model, opt))``: the bound arguments
    were not walked, so the gradients the step made looked hidden and every call was
    captured again (with a warning); they are arguments of each call now."""
    import functools

    def step(model, opt, x, y):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    model = mlp(DEVICE)
    compiled = xs.compile(functools.partial(step, model,
                                            torch.optim.SGD(model.parameters(), lr=0.1)))
    data = batches(4)
    expected, cpu_model = cpu_losses(lambda p: torch.optim.SGD(p, lr=0.1), data)
    xs.reset_metrics()
    losses = [compiled(*on_device(x, y)).item() for x, y in data]
    torch.testing.assert_close(losses, expected, rtol=1e-5, atol=1e-6)
    assert xs.metrics()["step_hidden_state"] == 0 and xs.metrics()["step_replays"] >= 2
